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

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from opaque_subclass.core.errors import OpaqueAttributeError, OpaqueTypeError, describe_type, import_fix, subject
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
        raise OpaqueTypeError(
            f"{subject(cls)}.__tensor_flatten__() at {path!r} returned "
            f"{describe_type(result)}; it must return a pair (attribute_names, context). "
            'Fix: `return ["_data", "_mesh"], ctx` with ctx any hashable value.'
        )
    names, ctx = result
    if names is not None and not isinstance(names, (list, tuple, str)):
        raise OpaqueTypeError(
            f"{subject(cls)}.__tensor_flatten__() at {path!r} returned attribute names as "
            f"{describe_type(names)}; they must be a list or tuple, whose order fixes the flat "
            "slots (a set has no order; a generator is used up by the first reader). "
            f'Fix: return a list such as ["_data", "_mesh"].'
        )
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise OpaqueTypeError(
            f"{subject(cls)}.__tensor_flatten__() at {path!r} returned attribute names "
            f"{names!r}; the first element must be a list of attribute-name strings. "
            'Fix: return a list such as ["_data", "_mesh"].'
        )
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise OpaqueTypeError(
            f"{subject(cls)}.__tensor_flatten__() at {path!r} lists {repeated} more than "
            f"once in {list(names)!r}; each attribute gets one flat slot. Fix: list each attribute "
            f"name once, e.g. {list(dict.fromkeys(names))!r}."
        )
    return tuple(names), ctx


def bad_attribute(owner: torch.Tensor, name: str, path: str, value: object) -> TypeError:
    """The error for attribute ``name`` of ``owner`` (at ``path``), listed by
    ``__tensor_flatten__`` but neither a tensor nor a registered reference opaque."""
    owner_cls = type(owner)
    value_cls = opaque_type_of(value)
    kind = opaque_kind(value_cls)
    # torch's own sentence for this case (torch 2.12 - 2.15, a RuntimeError), kept first so that code
    # matching torch's text still matches; ours follows it with the path, the type and the fix
    torch_sentence = (
        f"{value_cls.__name__!r} found in tensor attrs of {owner_cls.__name__}.__tensor_flatten__(). "
        "Only tensors and reference-type opaques are allowed in tensor attrs. "
    )
    where = (
        f"{torch_sentence}{subject(owner_cls)}.__tensor_flatten__() lists attribute {name!r} "
        f"(path {path!r}), which holds {describe_type(value)}"
    )
    if kind == "value":
        return ValueOpaqueListedError(
            f"{where}, a value-type opaque. Value opaques are constants that torch.compile "
            "compares and bakes into the graph, so they belong in the flatten context, not "
            "in the attribute list. Fix: remove it from the names and return it in the "
            f"context (`return names, (..., self.{name})`), or, if its identity matters, "
            "re-register the class as a reference opaque in a fresh process."
        )
    if is_torch_handled_type(value_cls):
        return OpaqueTypeError(
            f"{where}, one of torch's own value types, which torch.compile handles itself "
            "and which cannot be an opaque. Fix: move "
            f"{name!r} into the flatten context (second return value of __tensor_flatten__) "
            "and read it back in __tensor_unflatten__."
        )
    if value_cls.__module__ == "builtins" or value_cls is type(None):
        return OpaqueTypeError(
            f"{where}. Fix: move {name!r} into the flatten context (second return value of "
            "__tensor_flatten__) and read it back in __tensor_unflatten__."
        )
    return OpaqueTypeError(
        f"{where}, which is neither a tensor nor a registered reference opaque. Fix: "
        + import_fix(
            value_cls,
            'opaque_subclass.register_opaque({cls}, kind="reference")',
        )
        + f", or move {name!r} into the flatten context if it is a constant."
    )


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
            raise OpaqueAttributeError(
                f"{subject(type(t))}.__tensor_flatten__() lists attribute {name!r} "
                f"(path {inner_path!r}) but the tensor has no such attribute (found: nothing; it was "
                f"deleted, or never set). Fix: {_missing_fix(t, path, name)}"
            ) from None
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
        raise OpaqueTypeError(
            f"{subject(type(t))}.__tensor_flatten__() at {path!r} lists no tensor attribute "
            f"(names {list(names)!r}); a traceable wrapper subclass needs at least one inner tensor, "
            "from which torch builds its fake and functional copies while tracing. Fix: "
            + _no_tensor_fix(t, names, ctx)
        )
    return Level(t, path, ctx, tuple(attrs))


def _missing_fix(t: object, path: str, name: str) -> str:
    """The fix for attribute ``name`` listed by ``t`` (at ``path``) but missing:
    set it again (the statement uses ``path`` where it is a Python expression
    the caller has, else ``t``), or list only attributes every instance has."""
    owner = type(t).__qualname__
    plain = re.fullmatch(r"[A-Za-z_]\w*(\[\d+\])*(\.[A-Za-z_]\w*)*", path) and not path.startswith(("L[", "G["))
    var = path if plain else "t"
    where = "" if plain else f"t: the {owner} at {path!r}; "
    return (
        f"set it on the instance before using it, `{var}.{name} = value` ({where}value: the tensor or "
        f"registered reference opaque it should hold), or return only names of attributes that "
        f"__init__/__new__ sets on every instance from {owner}.__tensor_flatten__."
    )


def _literal(value: object) -> str | None:
    """``repr(value)`` when it is a short literal that evaluates back to ``value``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
    elif isinstance(value, tuple) and all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
        text = repr(value)
    else:
        return None
    return text if len(text) <= 40 else None


def _no_tensor_fix(t: object, names: tuple[str, ...], ctx: object) -> str:
    """The fix for a level that lists no tensor: list the instance's own tensor
    attribute when it has one (read from its ``__dict__``, nothing called),
    else say which kind of attribute to add; the names are never assumed."""
    try:
        held = [n for n, v in vars(t).items() if isinstance(v, _Tensor) and n not in names]
        context = _literal(ctx)
    except Exception:  # an error message must never crash
        held, context = [], None
    if held:
        shown = context if context is not None else "ctx"
        where = "" if context is not None else " (ctx: the context it returns now)"
        return f"list its tensor attribute {held[0]!r} first, `return {[held[0], *names]!r}, {shown}`{where}."
    return (
        "keep the data in a tensor attribute set in __new__ (the instance has none) and return its "
        f"name first: ['<tensor attribute>', *{list(names)!r}], with <tensor attribute> that name."
    )


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
