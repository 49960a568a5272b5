"""The distribution's shape, read from the checkout (``nox -s package`` builds,
installs and checks the real sdist and wheel).

Both packages ship their annotations (PEP 561): a ``py.typed`` marker in each,
declared as package data in ``pyproject.toml`` so that a wheel carries it too.
Without the marker, mypy ignores the library's annotations in a user's project.

The version is written once, in ``opaque_subclass/_version.py``: the package
reads it from there and ``pyproject.toml`` takes it from there (``dynamic``), so
an installed distribution's metadata says the version the code says. The
license is declared as an SPDX expression with LICENSE as its file, and
CHANGELOG.md has a section for the version.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.resources
import json
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

import opaque_subclass
from opaque_subclass import _version
from opaque_subclass.releases import LIBRARY_VERSION

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("opaque_subclass", "compile_passes")


def _package_data() -> dict[str, list[str]]:
    """``[tool.setuptools.package-data]`` of the checkout's ``pyproject.toml``."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        if sys.version_info >= (3, 11):
            import tomllib
        else:
            import tomli as tomllib
    except ImportError:  # Python 3.10 without tomli: read the one table by hand
        table = re.search(r"^\[tool\.setuptools\.package-data\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        assert table is not None, "pyproject.toml has no [tool.setuptools.package-data] table"
        entries = re.findall(r"^(\w+)\s*=\s*(\[.*?\])", table.group(1), re.M)
        return {key: ast.literal_eval(value) for key, value in entries}
    return tomllib.loads(text)["tool"]["setuptools"].get("package-data", {})


@pytest.mark.parametrize("package", PACKAGES)
def test_py_typed_marker_is_in_the_package(package: str) -> None:
    marker = importlib.resources.files(package) / "py.typed"
    assert marker.is_file(), f"{package} has no py.typed marker (PEP 561); create {package}/py.typed (empty)"


@pytest.mark.parametrize("package", PACKAGES)
def test_pyproject_declares_py_typed_as_package_data(package: str) -> None:
    data = _package_data()
    assert "py.typed" in data.get(package, []), (
        f"[tool.setuptools.package-data] in pyproject.toml does not list py.typed for {package} "
        f'(found {data!r}); a wheel would leave the marker out. Fix: {package} = ["py.typed"]'
    )


def test_the_fallback_reader_agrees_with_tomllib(monkeypatch: pytest.MonkeyPatch) -> None:
    # the hand reader used on Python 3.10 without tomli gives what tomllib gives
    expected = _package_data()
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    assert _package_data() == expected


def _pyproject() -> dict[str, Any]:
    """The checkout's ``pyproject.toml``, parsed (tomllib; tomli, which pytest
    requires there, on Python 3.10)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _literal_assignment(path: Path, name: str) -> object:
    """The value a module's top-level ``name = <literal>`` assigns, read as
    setuptools' ``attr:`` reads it: from the source, without importing."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no top-level literal assignment to {name}")


def test_pyproject_reads_the_version_from_the_version_module() -> None:
    project = _pyproject()["project"]
    assert "version" not in project, (
        f"pyproject.toml writes the version ({project.get('version')!r}) a second time; "
        'Fix: dynamic = ["version"], read from opaque_subclass/_version.py'
    )
    assert "version" in project.get("dynamic", []), f"dynamic is {project.get('dynamic')!r}"
    attr = _pyproject()["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "opaque_subclass._version.__version__"
    module, name = attr.rsplit(".", 1)
    # a literal, so that a build reads it without importing the package (and torch)
    assert _literal_assignment(ROOT / (module.replace(".", "/") + ".py"), name) == opaque_subclass.__version__


def test_pyproject_has_no_literal_copy_of_the_version() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    copies = re.findall(rf"^.*[\"']{re.escape(opaque_subclass.__version__)}[\"'].*$", text, re.M)
    assert copies == [], f"pyproject.toml spells the version out: {copies}"


def test_the_package_has_one_version_literal() -> None:
    # __version__, LIBRARY_VERSION (saved archives, cache keys) are the one object
    assert opaque_subclass.__version__ is LIBRARY_VERSION is _version.__version__
    literals = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value == opaque_subclass.__version__
    ]
    assert [where.split(":")[0] for where in literals] == ["opaque_subclass/_version.py"], (
        f"the version is written in {literals}"
    )


def _is_this_checkout(dist: importlib.metadata.Distribution) -> bool:
    """Whether the installed distribution provides the imported package: an
    editable install of the checkout the package was imported from, or an
    install whose files include the imported ``__init__.py``."""
    package = Path(opaque_subclass.__file__).resolve()
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("dir_info", {}).get("editable"):
        source = Path(unquote(urlparse(direct_url["url"]).path)).resolve()
        return package.is_relative_to(source)
    return any(Path(str(dist.locate_file(f))).resolve() == package for f in dist.files or ())


def test_installed_metadata_says_the_package_version() -> None:
    try:
        dist = importlib.metadata.distribution("opaque-subclass")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("opaque-subclass is not installed (the checkout is imported from PYTHONPATH)")
    if not _is_this_checkout(dist):
        pytest.skip(f"the installed opaque-subclass {dist.version} is another copy than {opaque_subclass.__file__}")
    assert dist.version == opaque_subclass.__version__, (
        f"the metadata importlib.metadata finds for this checkout (an install, or the "
        f"opaque_subclass.egg-info folder that pip and build write into the checkout) says {dist.version}, "
        f"the package {opaque_subclass.__version__}: it is stale. Fix: python -m pip install -e ."
    )


def test_the_license_is_declared_once_and_ships() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    # setuptools (>= 77) refuses a "License ::" classifier next to an SPDX expression
    assert [c for c in project["classifiers"] if c.startswith("License ::")] == []
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License\n\nCopyright (c) 2026, the opaque-subclass authors\n")
    assert "3. Neither the name of the copyright holder nor the names of its" in text


def test_python_classifiers_start_at_requires_python() -> None:
    project = _pyproject()["project"]
    floor = re.fullmatch(r">=\s*3\.(\d+)", project["requires-python"])
    assert floor is not None, f"requires-python is {project['requires-python']!r}"
    minors = [
        int(m) for c in project["classifiers"] for m in re.findall(r"^Programming Language :: Python :: 3\.(\d+)$", c)
    ]
    assert minors and min(minors) == int(floor.group(1)), (
        f"requires-python {project['requires-python']}, classifiers for 3.x with x in {minors}"
    )
    assert minors == list(range(min(minors), max(minors) + 1)), f"a gap in the Python classifiers: {minors}"


def test_the_changelog_has_a_section_for_the_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    heading = f"## [{opaque_subclass.__version__}]"
    assert any(line.startswith(heading) for line in text.splitlines()), f"CHANGELOG.md has no {heading} section"
