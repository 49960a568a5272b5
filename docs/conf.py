"""Sphinx settings of the documentation site (``python -m nox -s docs``).

The guide is the Markdown pages of this folder, read by MyST. They stay plain
Markdown, as GitHub renders them and ``check_examples.py`` runs them, so what
the site needs beyond that is added here, as Sphinx reads them:

* the table of contents of ``index.md`` (:func:`_add_toctree`);
* the anchors that pages set with ``<a id="name"></a>`` (``errors.md``): links
  to them resolve like links to headings (:class:`_HtmlAnchors`);
* links to Markdown files of the repository outside ``docs/``
  (``../benchmarks/README.md``) become links to the file, copied into the site;
  the file and the anchor must exist (:func:`_link_outside_files`).

Links between pages (``export.md#saving-and-loading``) resolve against the
anchors MyST gives headings, GitHub's slugs; a missing page, anchor or file is
a warning, and the session builds with warnings as errors.

The API reference is ``api/*.rst``: autodoc directives, one per public name,
that render the docstrings' reST (roles such as :func:`x` included;
NumPy-style sections through napoleon). A name whose object has no docstring
of its own (a constant, a class re-exported from torch) gets the ``#:``
comment that documents it in the library's source (:func:`_library_docs`);
the collective ops get the docstring and signature of their implementation;
free text after a docstring's last section is a ``Notes`` section
(:func:`_free_text_as_notes`).
"""

from __future__ import annotations

import inspect
import itertools
import re
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.transforms import Transform

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the checkout, not a stale install

project = "opaque-subclass"
author = "opaque-subclass contributors"
copyright = "opaque-subclass contributors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]

root_doc = "index"
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# errors_source.md is not a page: it is the source docs/gen_errors.py writes errors.md from.
exclude_patterns = ["_build", "__pycache__", "errors_source.md"]

# The guide's pages in reading order after index.md; api/index is the reference.
GUIDE = [
    "core",
    "authoring",
    "adopting",
    "export",
    "distributed",
    "large_jobs",
    "compile_passes",
    "backport",
    "compatibility",
    "errors",
    "cli",
    "architecture",
    "api/index",
]

# GitHub's anchors for headings of every level, so that the same links work
# on GitHub and on the site.
myst_heading_anchors = 6

# NumPy-style sections (Parameters / Returns / Raises); no Google style is used.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = "opaque-subclass"
html_show_sourcelink = False
html_copy_source = False

# The packages whose public names the reference documents.
PUBLIC = (
    "opaque_subclass",
    "opaque_subclass.adoption",
    "opaque_subclass.export",
    "opaque_subclass.sharded",
    "opaque_subclass.dtensor",
    "opaque_subclass.testing",
    "compile_passes",
)


# ------------------------------------------------------------------ the guide


def _add_toctree(app: Any, docname: str, source: list[str]) -> None:
    """Append the (hidden) table of contents to the root page as Sphinx reads it."""
    if docname == root_doc:
        entries = "\n".join(GUIDE)
        source[0] += f"\n\n```{{toctree}}\n:hidden:\n:maxdepth: 2\n\n{entries}\n```\n"


_ANCHOR = re.compile(r'<a id="([^"]+)">(</a>)?')


class _HtmlAnchors(Transform):
    """``<a id="name"></a>`` (raw HTML, which MyST passes through) becomes a
    target ``name`` that links (``#name``, ``errors.md#name``) resolve like a
    heading's anchor."""

    default_priority = 870  # before MyST's ResolveAnchorIds (879)

    def apply(self, **kwargs: Any) -> None:
        slugs = getattr(self.document, "myst_slugs", None)
        if slugs is None:  # not a Markdown page
            return
        for raw in list(self.document.findall(nodes.raw)):
            match = _ANCHOR.fullmatch(raw.astext().strip()) if raw.get("format") == "html" else None
            if not match:
                continue
            # A line of its own is a paragraph of two raw nodes, "<a id=...>" and "</a>".
            close = raw.next_node(descend=False, siblings=True)
            parts = [raw] if match.group(2) else [raw, close]
            if not match.group(2) and not (isinstance(close, nodes.raw) and close.astext().strip() == "</a>"):
                continue
            name = match.group(1)
            # The id may exist already: a heading's own ("Errors left out" is errors-left-out).
            target = None if name in self.document.ids else nodes.target("", "", ids=[name])
            parent = raw.parent
            if isinstance(parent, nodes.paragraph) and len(parent.children) == len(parts):
                parts = [parent]  # the paragraph holds nothing else
            else:
                for part in parts[1:]:
                    part.parent.remove(part)
            if target is None:
                parts[0].parent.remove(parts[0])
            else:
                target.line, target.source = raw.line, raw.source
                parts[0].replace_self(target)
                self.document.set_id(target)
            slugs[name] = (raw.line or 0, name, name)
        env = getattr(self.document.settings, "env", None)
        if env is not None and slugs:
            env.metadata[env.docname]["myst_slugs"] = slugs


_LINK_OUT = re.compile(r"\]\((\.\./[^)#\s]+\.md)(#[^)\s]*)?\)")


def _heading_slugs(path: Path) -> set[str]:
    """The anchors GitHub (and MyST) give the headings of a Markdown file."""
    from markdown_it import MarkdownIt
    from myst_parser.mdit_to_docutils.base import default_slugify

    tokens = MarkdownIt("commonmark").parse(path.read_text())
    slugs: set[str] = set()
    for heading, inline in itertools.pairwise(tokens):
        if heading.type == "heading_open":
            text = "".join(child.content for child in inline.children or ())
            slug = base = default_slugify(text)
            n = 0
            while slug in slugs:
                n += 1
                slug = f"{base}-{n}"
            slugs.add(slug)
    return slugs


def _link_outside_files(app: Any, docname: str, source: list[str]) -> None:
    """Rewrite links to Markdown files outside ``docs/`` as links to the file
    (MyST's ``path:``, copied into the site); warn when the file or the anchor
    is missing."""
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    page = DOCS / f"{docname}.md"
    if not page.is_file():
        return

    def rewrite(match: re.Match[str]) -> str:
        link, anchor = match.group(1), match.group(2)
        target = (page.parent / link).resolve()
        if DOCS in target.parents:
            return match.group(0)  # a page of the site: MyST checks it
        # A missing file is reported by Sphinx ("download file not readable").
        if anchor and target.is_file() and anchor[1:] not in _heading_slugs(target):
            line = source[0].count("\n", 0, match.start()) + 1
            logger.warning("link to a missing anchor: %s%s", link, anchor, location=(docname, line))
        return f"](path:{link})"

    source[0] = _LINK_OUT.sub(rewrite, source[0])


# ------------------------------------------------------------------ the reference


def _library_docs(name: str, obj: object) -> list[str] | None:
    """The ``#:`` comment that documents ``obj`` under its public ``name`` in a
    module of the library, or ``None``."""
    from sphinx.pycode import ModuleAnalyzer

    short = name.rpartition(".")[2]
    for modname in sorted(sys.modules):
        if not modname.startswith(("opaque_subclass", "compile_passes")):
            continue
        if getattr(sys.modules[modname], "__dict__", {}).get(short) is not obj:
            continue
        try:
            docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
        except Exception:  # no source (a namespace or extension module)
            continue
        if ("", short) in docs:
            return list(docs[("", short)])
    return None


def _is_custom_op(obj: object) -> bool:
    return type(obj).__name__ == "CustomOpDef" and callable(getattr(obj, "_init_fn", None))


_RULE = re.compile(r"-{3,}\s*")
_FREE_TEXT_SECTIONS = {"Notes", "Examples", "References", "Warnings", "See Also"}


def _free_text_as_notes(lines: list[str]) -> None:
    """Put a ``Notes`` header before a paragraph that follows the entries of a
    NumPy section (``Parameters``, ``Returns``, ``Attributes``...).

    Some docstrings end with free text after their last section; napoleon
    would read each of its lines as one more entry (a parameter named
    "Registering a class again..."). A paragraph is a line at the margin after
    a blank line whose next line is also at the margin (an entry's next line is
    its indented description)."""
    in_entries = False
    i = 0
    while i < len(lines):
        line = lines[i]
        after = lines[i + 1] if i + 1 < len(lines) else ""
        at_margin = bool(line.strip()) and not line[0].isspace()
        if at_margin and _RULE.fullmatch(after):
            in_entries = line.strip() not in _FREE_TEXT_SECTIONS
            i += 2
            continue
        if in_entries and at_margin and i > 0 and not lines[i - 1].strip() and after.strip() and not after[0].isspace():
            lines[i:i] = ["Notes", "-----"]
            in_entries = False
            i += 2
        i += 1


def _prepare_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Before napoleon: free text after the sections as ``Notes``; no docstring
    of a constant's type (``str``, ``dict``) for the constant."""
    _free_text_as_notes(lines)
    if what == "data" and lines and "\n".join(lines).strip() == inspect.getdoc(type(obj)):
        lines[:] = []


def _library_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """After napoleon (which would read a comment's first "text: more text" as
    a type): a public name's ``#:`` comment, a collective op's implementation's
    docstring."""
    if name.rpartition(".")[0] not in PUBLIC:
        return
    if _is_custom_op(obj):
        qualname = f"{obj._namespace}::{obj._name}"
        doc = inspect.getdoc(obj._init_fn) or ""
        lines[:] = [f"Custom op ``{qualname}`` (``torch.ops.{obj._namespace}.{obj._name}``).", "", *doc.splitlines()]
        return
    comment = _library_docs(name, obj)
    if comment is not None:
        lines[:] = comment


def _process_signature(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None, return_annotation: str | None
) -> tuple[str | None, str | None] | None:
    if not _is_custom_op(obj):
        return None
    from sphinx.util.inspect import stringify_signature

    sig = inspect.signature(obj._init_fn)
    return stringify_signature(sig, show_return_annotation=False), stringify_signature(sig).partition(" -> ")[2] or None


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _add_toctree)
    app.connect("source-read", _link_outside_files)
    app.add_transform(_HtmlAnchors)
    app.connect("autodoc-process-docstring", _prepare_docstring, priority=400)  # napoleon's is 500
    app.connect("autodoc-process-docstring", _library_docstring, priority=600)
    app.connect("autodoc-process-signature", _process_signature)
    return {"parallel_read_safe": True}
