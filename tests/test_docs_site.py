"""The documentation site's sources cover the public API and every page.

The site itself is built by ``python -m nox -s docs`` (Sphinx, docs/conf.py);
these checks read its sources only, so they run without Sphinx installed:

* every name of the public packages' ``__all__`` has an entry in the API
  reference (docs/api/*.rst), and the reference documents no other name of
  those packages, so that a new public name without an entry, or an entry
  for a name no longer public, fails here;
* every page of the guide (docs/*.md) is in the site's table of contents
  (``GUIDE`` in docs/conf.py).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
API = DOCS / "api"

# The packages whose public names the reference documents (PUBLIC in docs/conf.py).
PUBLIC = [
    "opaque_subclass",
    "opaque_subclass.adoption",
    "opaque_subclass.export",
    "opaque_subclass.sharded",
    "opaque_subclass.dtensor",
    "opaque_subclass.testing",
    "compile_passes",
]

# ".. autofunction:: pkg.name" / ".. autoclass:: ..." / ".. autodata:: ..." ...
_AUTO = re.compile(r"^\.\. auto(?:function|class|exception|data|attribute|method|module):: +(\S+)\s*$")
# ".. py:class:: Name" followed by an option line ":module: pkg" (an entry written by hand)
_PY = re.compile(r"^\.\. py:(?:function|class|exception|data|attribute):: +([\w.]+)")
_MODULE_OPTION = re.compile(r"^\s+:module: +(\S+)\s*$")


def documented_names(text: str) -> set[str]:
    """The qualified names that the top-level directives of a reST page document."""
    names: set[str] = set()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        auto = _AUTO.match(line)
        if auto:
            names.add(auto.group(1))
            continue
        py = _PY.match(line)
        if py:
            module = next((m.group(1) for m in map(_MODULE_OPTION.match, lines[i + 1 : i + 4]) if m), None)
            names.add(f"{module}.{py.group(1)}" if module else py.group(1))
    return names


def _reference() -> set[str]:
    pages = sorted(API.glob("*.rst"))
    assert pages, f"no API reference pages in {API}"
    return set().union(*(documented_names(p.read_text()) for p in pages))


def test_documented_names_reads_both_kinds_of_entry():
    text = (
        ".. autofunction:: pkg.save\n\n.. autoclass:: pkg.Record\n\n"
        ".. py:class:: Member\n   :module: pkg\n\n   .. py:attribute:: USE_REAL\n\n"
        "Text that mentions pkg.hidden and .. autofunction:: pkg.inline is not an entry.\n"
    )
    assert documented_names(text) == {"pkg.save", "pkg.Record", "pkg.Member"}


@pytest.mark.parametrize("package", PUBLIC)
def test_every_public_name_has_a_reference_entry(package):
    module = importlib.import_module(package)
    public = {f"{package}.{name}" for name in module.__all__}
    missing = sorted(public - _reference())
    assert not missing, f"public names without an entry in docs/api/*.rst: {missing}"


def test_the_reference_documents_only_public_names():
    public = {f"{p}.{name}" for p in PUBLIC for name in importlib.import_module(p).__all__}
    entries = {name for name in _reference() if name not in PUBLIC}  # automodule entries: the packages
    stale = sorted(entries - public)
    assert not stale, f"entries in docs/api/*.rst for names no public __all__ lists: {stale}"


def test_the_hand_written_member_entry_lists_every_member():
    # opaque_subclass.Member is torch's enum, documented by hand (autodoc would
    # only say "alias of MemberType"): its values must match the running torch's.
    import opaque_subclass

    text = (API / "opaque_subclass.rst").read_text()
    entry = text[text.index(".. py:class:: Member") :].split("\n.. ", 1)[0]
    listed = set(re.findall(r"\.\. py:attribute:: +(\w+)", entry))
    assert listed == {m.name for m in opaque_subclass.Member}


def _guide() -> list[str]:
    tree = ast.parse((DOCS / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "GUIDE" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("docs/conf.py has no GUIDE list")


def test_every_page_is_in_the_table_of_contents():
    # errors_source.md is the source docs/gen_errors.py writes errors.md from, not a page
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index", "errors_source"}
    api_pages = {f"api/{p.stem}" for p in API.glob("*.rst")} - {"api/index"}
    guide = _guide()
    assert len(guide) == len(set(guide)), f"a page is listed twice in GUIDE: {guide}"
    assert pages <= set(guide), f"pages missing from GUIDE in docs/conf.py: {sorted(pages - set(guide))}"
    assert "api/index" in guide
    index = (API / "index.rst").read_text()
    missing = sorted(p for p in api_pages if not re.search(rf"^\s+{p.removeprefix('api/')}\s*$", index, re.M))
    assert not missing, f"reference pages missing from the toctree of docs/api/index.rst: {missing}"


def test_conf_lists_the_same_public_packages():
    tree = ast.parse((DOCS / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PUBLIC" for t in node.targets):
            assert list(ast.literal_eval(node.value)) == PUBLIC
            return
    raise AssertionError("docs/conf.py has no PUBLIC list")
