"""The one walk over a live subclass instance.

:func:`read_level` is the one place that reads what ``__tensor_flatten__``
returns *and uses it* (three others only compare names with metadata built
here: the generated per-call unwrap of :mod:`~opaque_subclass.core.codegen`, its
``check_structure``, and ``compile_passes.context``). It reads one level of a
traceable wrapper subclass once and validates it: the names are a list or tuple
of distinct strings naming existing attributes, each value a tensor (plain or a
nested traceable subclass) or a registered reference opaque; else the core's
error names the subclass, attribute path, type found and fix.

:func:`walk` iterates a (nested) instance depth first in flatten order, yielding
``(path, slot)``: a :class:`Level` entering a subclass, an :class:`Attr` per
tensor or opaque leaf. Everything looking inside a live subclass uses these
two: flattening and spec building (:mod:`~opaque_subclass.core.flatten`), the
run-time unwrap, the rebuild check, tangents, the parametrization, diagnostics
and every backport patch. The walk over a *spec* is
:func:`~opaque_subclass.core.spec.iter_slots`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from opaque_subclass.core import messages
from opaque_subclass.core.errors import OpaqueTypeError
from opaque_subclass.core.registry import is_torch_handled_type, opaque_kind, opaque_type_of

__all__ = [
    "Attr",
    "Level",
    "ValueOpaqueListedError",
    "bad_attribute",
    "is_wrapper_subclass",
    "leaves",
    "read_level",
    "tensor_leaves",
    "walk",
]

_Tensor = torch.Tensor
_WRAPPER_TYPES: dict[type, bool] = {}

AttrKind = Literal["tensor", "subclass", "opaque", "other"]


def is_wrapper_subclass(x: object) -> bool:
    """Whether ``x`` is a traceable wrapper subclass instance (defines both
    ``__tensor_flatten__`` and ``__tensor_unflatten__``)."""
    cls = type(x)
    known = _WRAPPER_TYPES.get(cls)
    if known is None:
        known = (
            issubclass(cls, _Tensor)
            and cls is not _Tensor
            and hasattr(cls, "__tensor_flatten__")
            and hasattr(cls, "__tensor_unflatten__")
        )
        _WRAPPER_TYPES[cls] = known
    return known


@dataclass(frozen=True, slots=True)
class Attr:
    """One attribute listed by ``__tensor_flatten__``: its name, its path from
    the walk's root (``x._inner._mesh``), its kind and its value."""

    name: str
    path: str
    kind: AttrKind
    value: Any


@dataclass(frozen=True, slots=True)
class Level:
    """One level of a wrapper subclass, read once: the instance, its path, the
    flatten context and the listed attributes in flatten order."""

    owner: torch.Tensor
    path: str
    ctx: Any
    attrs: tuple[Attr, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    def tensors(self) -> list[Attr]:
        """The tensor attributes (plain or subclass), in flatten order."""
        return [a for a in self.attrs if a.kind in ("tensor", "subclass")]

    def opaques(self) -> dict[str, Any]:
        """The reference opaques, ``{name: object}`` in flatten order."""
        return {a.name: a.value for a in self.attrs if a.kind == "opaque"}


def _names(owner: torch.Tensor, result: object, path: str) -> tuple[tuple[str, ...], Any]:
    cls = type(owner)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise messages.flatten_not_a_pair(cls, path, result)
    names, ctx = result
    if names is not None and not isinstance(names, (list, tuple, str)):
        raise messages.names_not_a_sequence(cls, path, names)
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise messages.names_not_strings(cls, path, names)
    if len(set(names)) != len(names):
        raise messages.names_repeated(cls, path, names)
    return tuple(names), ctx


def bad_attribute(owner: torch.Tensor, name: str, path: str, value: object) -> TypeError:
    """The error for attribute ``name`` of ``owner`` (at ``path``), listed by
    ``__tensor_flatten__`` but neither a tensor nor a registered reference opaque."""
    owner_cls = type(owner)
    value_cls = opaque_type_of(value)
    if opaque_kind(value_cls) == "value":
        return messages.value_opaque_listed(ValueOpaqueListedError, owner_cls, name, path, value, value_cls)
    if is_torch_handled_type(value_cls):
        return messages.torch_value_listed(owner_cls, name, path, value, value_cls)
    if value_cls.__module__ == "builtins" or value_cls is type(None):
        return messages.builtin_listed(owner_cls, name, path, value, value_cls)
    return messages.unregistered_listed(owner_cls, name, path, value, value_cls)


class ValueOpaqueListedError(OpaqueTypeError):
    """A value-type opaque listed among the attributes of ``__tensor_flatten__``.

    Torch's own check raises ``ValueError`` for this case; the backport's patch
    of that check re-raises this error's message as one."""


def read_level(t: torch.Tensor, path: str = "x", *, strict: bool = True) -> Level:
    """Read one level of the wrapper subclass ``t``: one validated ``__tensor_flatten__`` call (see the
    module docstring); ``path`` names ``t`` in errors. With ``strict=False`` a value neither tensor nor
    reference opaque gets kind ``"other"``, for a caller checking values against slots itself (tangents)."""
    names, ctx = _names(t, t.__tensor_flatten__(), path)  # type: ignore[attr-defined]  # a wrapper subclass
    attrs = []
    for name in names:
        inner_path = f"{path}.{name}"
        try:
            value = getattr(t, name)
        except AttributeError:
            raise messages.attribute_missing(t, path, name) from None
        if isinstance(value, _Tensor):
            kind: AttrKind = "subclass" if is_wrapper_subclass(value) else "tensor"
        elif opaque_kind(value) == "reference":
            kind = "opaque"
        elif strict:
            raise bad_attribute(t, name, inner_path, value)
        else:
            kind = "other"
        attrs.append(Attr(name, inner_path, kind, value))
    if strict and not any(a.kind != "opaque" for a in attrs):
        raise messages.no_tensor_attribute(t, path, names, ctx)
    return Level(t, path, ctx, tuple(attrs))


def walk(x: object, path: str = "x") -> Iterator[tuple[str, Level | Attr]]:
    """Iterate ``x`` depth first in flatten order: ``(path, Level)`` on entering
    each wrapper subclass (``x`` itself first), ``(path, Attr)`` for each plain
    tensor or opaque leaf under it. Nothing is yielded for anything else.
    Each level's ``__tensor_flatten__`` is called once."""
    if not is_wrapper_subclass(x):
        return
    top = read_level(x, path)  # type: ignore[arg-type]  # a wrapper subclass is a tensor
    pending: list[Iterator[Attr]] = [iter(top.attrs)]
    yield path, top
    while pending:
        attr = next(pending[-1], None)
        if attr is None:
            pending.pop()
            continue
        if attr.kind == "subclass":
            level = read_level(attr.value, attr.path)
            yield attr.path, level
            pending.append(iter(level.attrs))
        else:
            yield attr.path, attr


def leaves(x: object, path: str = "x") -> list[Any]:
    """The flat leaves of ``x`` (tensors and opaques, flatten order), or ``[x]``."""
    if not is_wrapper_subclass(x):
        return [x]
    return [slot.value for _, slot in walk(x, path) if isinstance(slot, Attr)]


def tensor_leaves(x: torch.Tensor, path: str = "x") -> list[torch.Tensor]:
    """The innermost tensors of ``x`` (``[x]`` for a tensor that is not a
    wrapper subclass), flatten order; opaques left out."""
    if not is_wrapper_subclass(x):
        return [x]
    return [slot.value for _, slot in walk(x, path) if isinstance(slot, Attr) and slot.kind == "tensor"]
