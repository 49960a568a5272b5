"""The one table of torch releases: mode, registry API, patches and fixes.

Every difference between torch releases that the library cares about is named
here and nowhere else. A row of :data:`RELEASES` says, for one ``(major,
minor)`` release:

* the **mode** (``"native"``, ``"backport"`` or ``"unsupported"``);
* the **registry API** (:class:`RegistryAPI`): what torch calls its opaque
  registration function, its two kinds and its base class. torch 2.14 renamed
  opaque objects to "custom classes" (``register_custom_class(cls,
  typ="symbolic" | "constant")``, ``torch._custom_class_base.CustomClassBase``)
  and logs a deprecation for every use of the old names; the library calls the
  names of the running release, so it never triggers those logs;
* the **patch set** that provides the feature on a release without it
  (backport mode), as the name of the module holding its ``PATCH_SET``;
* the **fix set** for upstream bugs of a native release, as the name of the
  module holding its ``FIX_SET`` (``opaque_subclass.backport.v2_12`` and on;
  fixes shared by several releases live in ``opaque_subclass.backport.native``);
* the **known differences** (:class:`Difference`): behaviours of the release
  that differ from the newest release's, for a torch reason the library does
  not hide, each naming the entries of the cross-release conformance corpus
  (``tests/conformance.py``) that show it. The corpus runs on every leg and
  fails on a difference not listed here, and on a listed one that no longer
  shows;
* the **limits** every supported release shares (torch's, not hidden either).

docs/compatibility.md is checked against this table by a test.

Adding a release means adding a row here (and, for a backport, a patch
subpackage); nothing in the core changes. A release newer than the newest row
is taken as native when torch has the feature, with the newest row's registry
API if torch still has those names, and with no fixes (fixes are written
against exact sources and would be refused anyway).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import torch

#: This library's version (``opaque_subclass.__version__``), recorded in saved archives.
LIBRARY_VERSION = "0.1.0"

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

Mode = Literal["native", "backport", "unsupported"]
#: The library's names for the two kinds of opaque (see Note [Reference and value opaques]).
OpaqueKind = Literal["reference", "value"]


@dataclass(frozen=True, slots=True)
class RegistryAPI:
    """What one torch release calls the pieces of its opaque-object registry.

    Attributes
    ----------
    register
        Name of the registration function in ``torch._library.opaque_object``.
    kinds
        The library's kind -> torch's ``typ`` string for that kind.
    base_module, base, base_meta
        Module, class and metaclass that torch requires of a registered
        reference type (``isinstance(fake, cls)`` works through the metaclass).
    """

    register: str
    kinds: Mapping[OpaqueKind, str]
    base_module: str
    base: str
    base_meta: str

    def __post_init__(self) -> None:
        if set(self.kinds) != {"reference", "value"}:
            raise AssertionError(f"RegistryAPI.kinds must name both kinds, got {dict(self.kinds)}")

    def torch_module(self) -> Any:
        """``torch._library.opaque_object``."""
        return importlib.import_module("torch._library.opaque_object")

    def base_class(self) -> type:
        """torch's base class for reference opaques on this release."""
        return getattr(importlib.import_module(self.base_module), self.base)  # type: ignore[no-any-return]  # a class by construction

    def base_metaclass(self) -> type:
        """The metaclass of :meth:`base_class`."""
        return getattr(importlib.import_module(self.base_module), self.base_meta)  # type: ignore[no-any-return]  # a class by construction

    def register_in_torch(self, cls: type, kind: OpaqueKind, options: Mapping[str, Any] | None = None) -> None:
        """Call torch's own registration function with this release's names.

        ``options`` are torch's keyword arguments (``members``, ``guard_fn``,
        ``hoist``, ``reconstruct_fn``), only those the caller sets."""
        getattr(self.torch_module(), self.register)(cls, typ=self.kinds[kind], **(options or {}))

    def table_fields(self) -> tuple[str, ...]:
        """The fields of torch's registry entry on the running release
        (``reconstruct_fn`` appeared in torch 2.12)."""
        return tuple(f.name for f in dataclasses.fields(self.torch_module()._OpaqueTypeInfo))

    def enter_in_tables(self, cls: type, kind: OpaqueKind, options: Mapping[str, Any] | None = None) -> None:
        """Enter ``cls`` in torch's opaque tables directly, for a foreign class
        that cannot take torch's metaclass (torch's own registration function
        requires it). Refuses a torch whose table entry has fields this library
        does not know, leaving torch untouched."""
        registry = self.torch_module()
        info_type = registry._OpaqueTypeInfo
        name = f"{cls.__module__}.{cls.__qualname__}"
        known: dict[str, Any] = {
            "class_name": name,
            "opaque_typ": self.kinds[kind],
            "guard_fn": None,
            "members": {},
            "hoist": False,
            "reconstruct_fn": None,
            **(options or {}),
        }
        field_names = list(self.table_fields())
        unknown = [n for n in field_names if n not in known]
        if unknown:
            raise RuntimeError(
                f"cannot register {name} as an opaque on torch {torch.__version__}: torch's "
                f"opaque registry entry has fields {unknown} that opaque-subclass does not know. "
                "Fix: make the class inherit opaque_subclass.OpaqueBase, or use a torch "
                "version listed in opaque_subclass.SUPPORTED_TORCH."
            )
        info = info_type(**{n: known[n] for n in field_names})
        registry._OPAQUE_TYPES[cls] = info
        registry._OPAQUE_TYPES_BY_NAME[name] = info
        torch._C._register_opaque_type(name)

    def is_available(self) -> bool:
        """Whether the running torch has these names."""
        try:
            module = self.torch_module()
            importlib.import_module(self.base_module)
        except ImportError:
            return False
        return callable(getattr(module, self.register, None))


#: torch 2.11 - 2.13: ``register_opaque_type(cls, typ="reference" | "value")``.
OPAQUE_OBJECT_API = RegistryAPI(
    register="register_opaque_type",
    kinds={"reference": "reference", "value": "value"},
    base_module="torch._opaque_base",
    base="OpaqueBase",
    base_meta="OpaqueBaseMeta",
)

#: torch >= 2.14: ``register_custom_class(cls, typ="symbolic" | "constant")``.
CUSTOM_CLASS_API = RegistryAPI(
    register="register_custom_class",
    kinds={"reference": "symbolic", "value": "constant"},
    base_module="torch._custom_class_base",
    base="CustomClassBase",
    base_meta="CustomClassBaseMeta",
)


@dataclass(frozen=True, slots=True)
class Difference:
    """A behaviour of one release that differs from the newest release's.

    ``text`` says what differs and the torch reason; ``entries`` names the
    conformance corpus entries (``tests/conformance.py``) whose observations on
    this release differ from the reference because of it.
    """

    text: str
    entries: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class ReleaseSupport:
    """One row of the table: how the library runs on one torch release."""

    release: tuple[int, int]
    mode: Mode
    registry: RegistryAPI | None
    patches: str | None = None
    fixes: str | None = None
    differences: tuple[Difference, ...] = ()
    #: What torch cannot do on this release, whatever the release (shared limits).
    limits: tuple[str, ...] = ()
    #: False for a release newer than every row (taken on trust, untested).
    tested: bool = True

    @property
    def label(self) -> str:
        return f"{self.release[0]}.{self.release[1]}"


_FOREIGN_ISINSTANCE = (
    "isinstance(obj, C) inside a compiled region is False for a registered class C "
    "that does not inherit opaque_subclass.OpaqueBase (it sees torch's fake wrapper)"
)

_ATTRIBUTE_GUARD_TEXT = (
    "a recompile reason on an opaque's attribute reads object.__getattribute__(t._gauge, 'offset') == 2 "
    "(Dynamo 2.11 and 2.12 name the attribute source so; 2.13 and newer write t._gauge.offset == 2); "
    "the guard itself is the same"
)

#: The table. Keep docs/compatibility.md in step (a test compares them).
RELEASES: Mapping[tuple[int, int], ReleaseSupport] = {
    row.release: row
    for row in (
        ReleaseSupport(
            (2, 10),
            "unsupported",
            None,
            differences=(Difference("no opaque base class (torch._opaque_base); a backport is not written yet"),),
        ),
        ReleaseSupport(
            (2, 11),
            "backport",
            OPAQUE_OBJECT_API,
            patches="opaque_subclass.backport.v2_11",
            differences=(
                Difference(
                    "torch 2.11 does not register enum.Enum as a value opaque (2.12 and newer do): "
                    "opaque_kind(AnEnum) is None until register_opaque(AnEnum, kind='value')",
                    ("api/enum-is-value-opaque",),
                ),
                Difference(
                    "torch.export.save on a program holding reference opaques raises TypeError with the fix "
                    "opaque_subclass.export.save (the backport's archive patch); torch 2.12 and newer pickle "
                    "them by value and offer no hook to refuse",
                    ("export/torch-save-direct",),
                ),
                Difference(
                    _ATTRIBUTE_GUARD_TEXT,
                    ("members/attribute-use-real", "collectives/functional-all-reduce"),
                ),
                Difference(
                    "a mesh that reaches DTensor.from_local or redistribute in compiled code only as an "
                    "argument (not read from a DTensor input) is compiled in, guarded by equality: a later "
                    "call with an equal mesh returns a DTensor on the first call's mesh (2.12 and newer: the "
                    "mesh passed in). Dynamo 2.11's DTensor handlers take the mesh as a constant and its fake "
                    "wrapper of an opaque input holds a copy, so the traced mesh cannot be matched to the input",
                    ("dtensor/from-local-mesh-argument/8-ranks",),
                ),
                Difference(
                    "torch 2.11's CUDA build without a GPU crashes (SIGSEGV in FakeTensorMode.__enter__) "
                    "when a thread compiles after another compiling thread has exited, with or without "
                    "the library: compile from one long-lived thread",
                    ("threads/compile-after-thread-exit",),
                ),
            ),
            limits=(_FOREIGN_ISINSTANCE,),
        ),
        ReleaseSupport(
            (2, 12),
            "native",
            OPAQUE_OBJECT_API,
            fixes="opaque_subclass.backport.v2_12",
            differences=(
                Difference(_ATTRIBUTE_GUARD_TEXT, ("members/attribute-use-real", "collectives/functional-all-reduce")),
            ),
            limits=(
                _FOREIGN_ISINSTANCE,
                "torch 2.12's CUDA build without a GPU may abort at interpreter exit ('terminate called "
                "without an active exception', exit 134) after threads that compiled have exited, with or "
                "without the library (4 of 6 runs of a 3-thread program): compile from one long-lived thread",
            ),
        ),
        ReleaseSupport(
            (2, 13),
            "native",
            OPAQUE_OBJECT_API,
            fixes="opaque_subclass.backport.v2_13",
            limits=(_FOREIGN_ISINSTANCE,),
        ),
        ReleaseSupport(
            (2, 14),
            "native",
            CUSTOM_CLASS_API,
            fixes="opaque_subclass.backport.v2_14",
            limits=(_FOREIGN_ISINSTANCE,),
        ),
        ReleaseSupport(
            (2, 15),
            "native",
            CUSTOM_CLASS_API,
            fixes="opaque_subclass.backport.v2_15",
            limits=(_FOREIGN_ISINSTANCE,),
        ),
    )
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
