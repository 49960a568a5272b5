"""A row of the release table (:mod:`opaque_subclass.releases`): :class:`ReleaseSupport`,
with its registry names (:class:`RegistryAPI`), its :class:`Difference` s from the
newest release, and :class:`~opaque_subclass.patching.Patch` rows."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from opaque_subclass.patching import Patch

__all__ = [
    "CUSTOM_CLASS_API",
    "OPAQUE_OBJECT_API",
    "Difference",
    "Mode",
    "OpaqueKind",
    "RegistryAPI",
    "ReleaseSupport",
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

    @classmethod
    def named(cls, register: str, stem: str, *, reference: str, value: str) -> RegistryAPI:
        """The API whose base class is ``torch._<stem>_base.<Stem>Base`` (metaclass
        ``<Stem>BaseMeta``), as torch names them (``opaque``: ``OpaqueBase``)."""
        base = stem.title().replace("_", "") + "Base"
        return cls(register, {"reference": reference, "value": value}, f"torch._{stem}_base", base, base + "Meta")

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
        """Call torch's registration function with this release's names; ``options``:
        torch's keyword arguments the caller sets (``members``, ``guard_fn``, ...)."""
        getattr(self.torch_module(), self.register)(cls, typ=self.kinds[kind], **(options or {}))

    def table_fields(self) -> tuple[str, ...]:
        """The fields of torch's registry entry on the running release
        (``reconstruct_fn`` appeared in torch 2.12)."""
        return tuple(f.name for f in dataclasses.fields(self.torch_module()._OpaqueTypeInfo))

    def enter_in_tables(self, cls: type, kind: OpaqueKind, options: Mapping[str, Any] | None = None) -> None:
        """Enter a foreign ``cls``, which cannot take the metaclass torch's registration
        requires, in torch's tables directly; refuses unknown entry fields, torch untouched."""
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
OPAQUE_OBJECT_API = RegistryAPI.named("register_opaque_type", "opaque", reference="reference", value="value")

#: torch >= 2.14: ``register_custom_class(cls, typ="symbolic" | "constant")``.
CUSTOM_CLASS_API = RegistryAPI.named("register_custom_class", "custom_class", reference="symbolic", value="constant")


@dataclass(frozen=True, slots=True)
class Difference:
    """A behaviour of one release that differs from the newest release's.

    ``text``: what differs and the torch reason; ``entries``: the conformance
    entries (``tests/conformance.py``) it makes differ on this release.
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
    #: Backport mode: the patches that provide the feature, applied all or nothing.
    patches: tuple[Patch, ...] = ()
    #: Native mode: the fixes of the release's upstream bugs, applied all or nothing.
    fixes: tuple[Patch, ...] = ()
    differences: tuple[Difference, ...] = ()
    #: What torch cannot do on this release, whatever the release (shared limits).
    limits: tuple[str, ...] = ()
    #: False for a release newer than every row (taken on trust, untested).
    tested: bool = True
    #: ``(file under torch/, digest)`` of the sources the fingerprints are read from
    #: (``tools/record_sources.py``): while unchanged, enabling parses none of them
    #: (:func:`opaque_subclass.patching.record_sources`).
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.release[0]}.{self.release[1]}"
