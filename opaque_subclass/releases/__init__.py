"""The one table of torch releases: one module per release, each all that the
library does on that release.

``opaque_subclass/releases/v2_NN.py`` holds the row of torch 2.NN
(:class:`~opaque_subclass.releases.schema.ReleaseSupport`):

* the **mode** (``"native"``, ``"backport"`` or ``"unsupported"``);
* the **registry API** (:class:`~opaque_subclass.releases.schema.RegistryAPI`):
  what torch calls its opaque registration function, its two kinds and its
  base class. torch 2.14 renamed opaque objects to "custom classes"
  (``register_custom_class(cls, typ="symbolic" | "constant")``) and logs a
  deprecation for every use of the old names; the library calls the names of
  the running release, so it never triggers those logs;
* the **patches** that provide the feature on a release without it (backport
  mode) or the **fixes** of a native release's upstream bugs, as rows: the
  torch function replaced, the fingerprint of its source, where the
  replacement lives (``opaque_subclass.backport`` for the feature,
  ``opaque_subclass.fixes`` for fixes and the input checks at torch's entry
  points);
* the **known differences** (:class:`~opaque_subclass.releases.schema.Difference`):
  behaviours that differ from the newest release's, for a torch reason the
  library does not hide, each naming the entries of the cross-release
  conformance corpus (``tests/conformance.py``) that show it. The corpus runs
  on every leg and fails on a difference not listed, and on a listed one that
  no longer shows;
* the **limits** every supported release shares (torch's, not hidden either).

A fix that several releases need is written once, in the table of fixes
(:mod:`opaque_subclass.releases.fix_table`), with each release's fingerprint;
a release module lists ``fix_rows((2, NN))``. Each row of ``patches`` or
``fixes`` replaces one torch function: its
qualified name, the fingerprint of the original's source (a torch build whose
source differs is refused whole, nothing patched), and where the replacement's
factory lives (its docstring says what fails without it and what changes with
it). ``import opaque_subclass`` applies a release's rows all or none,
``support().patched``/``support().fixes`` list them and ``disable()`` removes
them.

This package assembles :data:`RELEASES` from those modules and nothing else;
docs/compatibility.md is generated from it (``docs/gen_compatibility.py``) and
a test compares them. The modules hold data only (replacements are named, and
imported when the set is enabled), so the core can read the running row.

Adding a release means adding its module and listing it in :data:`RELEASES`;
nothing in the core changes. A release newer than the newest row is taken as
native when torch has the feature, with the newest row's registry API if torch
still has those names, and with no fixes (fixes are written against exact
sources and would be refused anyway).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from functools import cache

import torch

from opaque_subclass import _version
from opaque_subclass.releases import v2_10, v2_11, v2_12, v2_13, v2_14, v2_15
from opaque_subclass.releases.schema import (
    CUSTOM_CLASS_API,
    OPAQUE_OBJECT_API,
    Difference,
    Mode,
    OpaqueKind,
    RegistryAPI,
    ReleaseSupport,
)

#: This library's version (``opaque_subclass.__version__``), recorded in saved archives;
#: written once, in ``opaque_subclass/_version.py`` (the distribution's metadata reads it too).
LIBRARY_VERSION: str = _version.__version__

__all__ = [
    "CUSTOM_CLASS_API",
    "NEWEST",
    "OPAQUE_OBJECT_API",
    "RELEASES",
    "Difference",
    "Mode",
    "OpaqueKind",
    "RegistryAPI",
    "ReleaseSupport",
    "current",
    "parse_release",
    "release_support",
]

#: The table, one row per release module.
RELEASES: Mapping[tuple[int, int], ReleaseSupport] = {
    module.RELEASE.release: module.RELEASE for module in (v2_10, v2_11, v2_12, v2_13, v2_14, v2_15)
}

#: The newest release in the table.
NEWEST: tuple[int, int] = max(RELEASES)
#: The oldest supported release.
OLDEST_SUPPORTED: tuple[int, int] = min(r for r, row in RELEASES.items() if row.mode != "unsupported")


def parse_release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a torch version string such as ``"2.14.1+cu128"``."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _has_native_opaque_attrs() -> bool:
    """Whether AOTAutograd's subclass metadata has ``OpaqueMeta``: read from the
    imported module, or, so that importing the library does not import
    AOTAutograd, from its source file."""
    name = "torch._functorch._aot_autograd.schemas"
    module = sys.modules.get(name)
    if module is not None:
        return hasattr(module, "OpaqueMeta")
    path = os.path.join(os.path.dirname(torch.__file__), "_functorch", "_aot_autograd", "schemas.py")
    try:
        with open(path, encoding="utf-8") as f:
            return re.search(r"^class OpaqueMeta\b", f.read(), re.MULTILINE) is not None
    except OSError:  # no source file: ask the module
        try:
            module = importlib.import_module(name)
        except ImportError:  # pragma: no cover - torch without AOTAutograd
            return False
        return hasattr(module, "OpaqueMeta")


def release_support(version: str) -> ReleaseSupport:
    """The row for a torch version string (``torch.__version__``).

    A listed release that claims native support but lacks the feature (a
    development build from before it landed) and an unlisted release are
    reported as unsupported, except a release newer than :data:`NEWEST`, which
    is native when torch has the feature.
    """
    release = parse_release(version)
    if release is None:
        return ReleaseSupport((0, 0), "unsupported", None, differences=(Difference(f"unparsable version {version!r}"),))
    row = RELEASES.get(release)
    if row is not None:
        if row.mode == "native" and not _has_native_opaque_attrs():
            return ReleaseSupport(
                release, "unsupported", None, differences=(Difference("development build without the feature"),)
            )
        return row
    if release > NEWEST and _has_native_opaque_attrs():
        api = next(
            (a for a in (CUSTOM_CLASS_API, OPAQUE_OBJECT_API) if a.is_available()),
            None,
        )
        if api is not None:
            return ReleaseSupport(release, "native", api, tested=False)
    return ReleaseSupport(release, "unsupported", None)


@cache
def current() -> ReleaseSupport:
    """The row for the running torch."""
    return release_support(torch.__version__)
