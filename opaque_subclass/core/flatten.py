"""Flattening subclasses into leaves (tensors and opaques) and back.

:func:`describe` is the single inspection of a live subclass: it calls
``__tensor_flatten__`` at every level, validates each listed attribute and
builds the :class:`~opaque_subclass.core.spec.SubclassCreationMeta`. Flattening,
``create_subclass_meta`` and the spec-less unwrap all go through it or through
:func:`append_leaves`, which performs the same checks without building metas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opaque_subclass.core.errors import describe_type, import_fix, qualified_name
from opaque_subclass.core.registry import is_torch_handled_type, opaque_kind, opaque_type_of
from opaque_subclass.core.spec import (
    OpaqueMeta,
    PlainTensorMeta,
    SlotMeta,
    SubclassCreationMeta,
    _is_symbolic,
    iter_slots,
)

__all__ = [
    "append_leaves",
    "create_subclass_meta",
    "describe",
    "flatten_subclass",
    "is_wrapper_subclass",
    "unflatten_subclass",
]

_Tensor = torch.Tensor
_WRAPPER_TYPES: dict[type, bool] = {}


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


def _flatten_names(x: torch.Tensor, path: str) -> tuple[Sequence[str], Any]:
    cls = type(x)
    result = x.__tensor_flatten__()  # type: ignore[attr-defined]  # checked by is_wrapper_subclass
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(
            f"{cls.__qualname__}.__tensor_flatten__() at {path!r} returned "
            f"{describe_type(result)}; it must return a pair (attribute_names, context). "
            'Fix: `return ["_data", "_mesh"], ctx` with ctx any hashable value.'
        )
    names, ctx = result
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"{cls.__qualname__}.__tensor_flatten__() at {path!r} returned attribute names "
            f"{names!r}; the first element must be a list of attribute-name strings. "
            'Fix: return a list such as ["_data", "_mesh"].'
        )
    return names, ctx


def _bad_attribute(owner: torch.Tensor, name: str, path: str, value: object) -> Exception:
    owner_cls = type(owner)
    value_cls = opaque_type_of(value)
    kind = opaque_kind(value_cls)
    where = (
        f"{owner_cls.__qualname__}.__tensor_flatten__() lists attribute {name!r} "
        f"(path {path!r}), which holds {describe_type(value)}"
    )
    if kind == "value":
        error = TypeError(
            f"{where}, a value-type opaque. Value opaques are constants that torch.compile "
            "compares and bakes into the graph, so they belong in the flatten context, not "
            "in the attribute list. Fix: remove it from the names and return it in the "
            f"context (`return names, (..., self.{name})`), or, if its identity matters, "
            "re-register the class as a reference opaque in a fresh process."
        )
        # Read by callers that must raise torch's exception type for this case.
        error.opaque_kind = kind  # type: ignore[attr-defined]  # a plain attribute on the instance
        return error
    if is_torch_handled_type(value_cls):
        return TypeError(
            f"{where}, one of torch's own value types, which torch.compile handles itself "
            "and which cannot be an opaque. Fix: move "
            f"{name!r} into the flatten context (second return value of __tensor_flatten__) "
            "and read it back in __tensor_unflatten__."
        )
    if value_cls.__module__ == "builtins" or value_cls is type(None):
        return TypeError(
            f"{where}. Only tensors and registered reference opaques may be listed. "
            f"Fix: move {name!r} into the flatten context (second return value of "
            "__tensor_flatten__) and read it back in __tensor_unflatten__."
        )
    return TypeError(
        f"{where}, which is neither a tensor nor a registered reference opaque. Fix: "
        + import_fix(
            value_cls,
            'opaque_subclass.register_opaque({cls}, kind="reference")',
        )
        + f", or move {name!r} into the flatten context if it is a constant."
    )


def _get(owner: torch.Tensor, name: str, path: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise AttributeError(
            f"{type(owner).__qualname__}.__tensor_flatten__() lists attribute {name!r} "
            f"(path {path!r}) but the tensor has no such attribute. Fix: return only names "
            "of attributes that __init__/__new__ sets on every instance."
        ) from None


def describe(
    x: object,
    start_idx: int = 0,
    *,
    attr: str | None = None,
    path: str = "x",
    count_symints: bool = False,
    with_memory_format: bool = False,
) -> SlotMeta:
    """Build the meta of one value whose first slot is ``start_idx``.

    A wrapper subclass gets a :class:`SubclassCreationMeta` (recursively), a
    reference opaque an :class:`OpaqueMeta`, anything else a
    :class:`PlainTensorMeta`. ``path`` names ``x`` in error messages.
    """
    if not is_wrapper_subclass(x):
        if not isinstance(x, _Tensor) and opaque_kind(x) == "reference":
            return OpaqueMeta(start_idx, attr, opaque_type_of(x))
        fmt = None
        if with_memory_format and isinstance(x, _Tensor):
            fmt = torch._prims_common.suggest_memory_format(x)
        return PlainTensorMeta(start_idx, attr, fmt)
    assert isinstance(x, _Tensor)  # for type checkers: is_wrapper_subclass implies it
    names, ctx = _flatten_names(x, path)
    attrs: dict[str, SlotMeta] = {}
    idx = start_idx
    for name in names:
        inner_path = f"{path}.{name}"
        value = _get(x, name, inner_path)
        if isinstance(value, _Tensor):
            sub = describe(
                value,
                idx,
                attr=name,
                path=inner_path,
                count_symints=count_symints,
                with_memory_format=with_memory_format,
            )
            idx += sub.arg_count if isinstance(sub, SubclassCreationMeta) else 1
        elif opaque_kind(value) == "reference":
            sub = OpaqueMeta(idx, name, opaque_type_of(value))
            idx += 1
        else:
            raise _bad_attribute(x, name, inner_path, value)
        attrs[name] = sub
    is_fake = _holds_fake(x)
    return SubclassCreationMeta(
        flat_tensor_start_idx=start_idx,
        attrs=attrs,
        meta=ctx,
        outer_size=tuple(x.size()),
        outer_stride=tuple(x.stride()),
        subclass_type=type(x),
        attr=attr,
        included_subclass_symints=count_symints,
        memory_format=torch._prims_common.suggest_memory_format(x) if with_memory_format else None,
        original_subclass=x if is_fake else None,
    )


def _holds_fake(x: torch.Tensor) -> bool:
    """Whether a wrapper subclass's tensor leaves are fake (opaques skipped: torch
    2.11's own ``is_fake`` walks every listed attribute as a tensor)."""
    from torch._subclasses.fake_tensor import is_fake

    for name in x.__tensor_flatten__()[0]:  # type: ignore[attr-defined]  # a wrapper subclass
        value = getattr(x, name, None)
        if isinstance(value, _Tensor):
            return _holds_fake(value) if is_wrapper_subclass(value) else bool(is_fake(value))
    return False


def append_leaves(x: object, out: list[Any], path: str = "x", *, symints: bool = False) -> None:
    """Append the leaves of ``x`` to ``out``: a subclass's tensors and opaques,
    depth-first, or ``x`` itself. Validates like :func:`describe`. With
    ``symints``, each subclass's symbolic size and stride entries follow its
    leaves (the layout of a meta made with ``count_symints=True``)."""
    if not is_wrapper_subclass(x):
        out.append(x)
        return
    assert isinstance(x, _Tensor)  # for type checkers: is_wrapper_subclass implies it
    names, _ = _flatten_names(x, path)
    for name in names:
        value = _get(x, name, f"{path}.{name}")
        if isinstance(value, _Tensor):
            if is_wrapper_subclass(value):
                append_leaves(value, out, f"{path}.{name}", symints=symints)
            else:
                out.append(value)
        elif opaque_kind(value) == "reference":
            out.append(value)
        else:
            raise _bad_attribute(x, name, f"{path}.{name}", value)
    if symints:
        out.extend(s for s in x.size() if _is_symbolic(s))
        out.extend(s for s in x.stride() if _is_symbolic(s))


def flatten_subclass(t: torch.Tensor, *, name: str = "x") -> tuple[list[Any], SlotMeta]:
    """Flatten ``t`` into its leaves and the meta that rebuilds it.

    Parameters
    ----------
    t
        A tensor; a traceable wrapper subclass is flattened recursively, a plain
        tensor gives ``[t]`` and a :class:`PlainTensorMeta`.
    name
        What to call ``t`` in error messages (``x`` gives paths like ``x._mesh``).

    Returns
    -------
    leaves, spec
        ``leaves`` lists tensors and opaques in flat-slot order; opaques are the
        very objects held by ``t``. ``spec.unflatten(leaves)`` rebuilds ``t``.
    """
    if not isinstance(t, _Tensor):
        raise TypeError(
            f"flatten_subclass expects a tensor, got {describe_type(t)}. Fix: pass the "
            "subclass instance; for a list of arguments use create_subclass_meta."
        )
    spec = describe(t, 0, path=name)
    leaves: list[Any] = []
    append_leaves(t, leaves, name)
    return leaves, spec


def _bad_unflatten_result(meta: SubclassCreationMeta, result: object, path: str) -> TypeError:
    return bad_unflatten_type(meta.subclass_type, result, path)


def bad_unflatten_type(cls: type, result: object, path: str) -> TypeError:
    """The error for a ``__tensor_unflatten__`` of ``cls`` that returned ``result``,
    which is not an instance of ``cls``."""
    return TypeError(
        f"{cls.__qualname__}.__tensor_unflatten__ (rebuilding {path!r}) returned "
        f"{describe_type(result)}, expected an instance of {qualified_name(cls)}. Fix: "
        f"make {cls.__qualname__}.__tensor_unflatten__ return "
        f"{cls.__qualname__}(...) built from inner_tensors, the context and outer_size/"
        "outer_stride."
    )


def _check_leaf(path: str, slot: Any, leaf: object, owner: str) -> None:
    if isinstance(slot, OpaqueMeta):
        if isinstance(leaf, _Tensor) or opaque_kind(leaf) != "reference":
            if not isinstance(leaf, _Tensor) and opaque_kind(leaf) is None and isinstance(leaf, slot.opaque_type):
                raise TypeError(
                    f"unflatten of {owner}: slot {slot.unwrapped_idx} ({path!r}) holds a "
                    f"{qualified_name(type(leaf))}, which is not registered as a reference opaque in this "
                    "process. Fix: "
                    + import_fix(type(leaf), 'opaque_subclass.register_opaque({cls}, kind="reference")')
                    + " before rebuilding."
                )
            raise TypeError(
                f"unflatten of {owner}: slot {slot.unwrapped_idx} ({path!r}) expects a "
                f"reference opaque of type {qualified_name(slot.opaque_type)}, got "
                f"{describe_type(leaf)}. Fix: pass leaves in the order flatten_subclass "
                "returned them."
            )
    elif isinstance(slot, PlainTensorMeta) and slot.attr is not None:
        if not isinstance(leaf, _Tensor):
            raise TypeError(
                f"unflatten of {owner}: slot {slot.unwrapped_idx} ({path!r}) expects a "
                f"tensor, got {describe_type(leaf)}. Fix: pass leaves in the order "
                "flatten_subclass returned them."
            )


def build(meta: SlotMeta, leaves: Sequence[Any], *, is_runtime: bool, path: str = "x") -> Any:
    """Rebuild the value described by ``meta`` from the absolute slots of ``leaves``.

    The generic (not code-generated) path; used while tracing and for checked
    unflattening. Outer sizes come from the meta, or from ``leaves`` for
    symbolic placeholders when ``is_runtime``.
    """
    if not isinstance(meta, SubclassCreationMeta):
        return leaves[meta.unwrapped_idx]
    inner = {name: build(sub, leaves, is_runtime=is_runtime, path=f"{path}.{name}") for name, sub in meta.attrs.items()}
    size, stride = meta.outer_size, meta.outer_stride
    if is_runtime and meta.included_subclass_symints and (meta.size_placeholders or meta.stride_placeholders):
        size, stride = _fill_placeholders(meta, leaves)
    cls = meta.subclass_type
    result = cls.__tensor_unflatten__(inner, meta.meta, size, stride)  # type: ignore[attr-defined]  # a wrapper subclass
    if not isinstance(result, cls):
        raise _bad_unflatten_result(meta, result, path)
    if not is_runtime and meta.original_subclass is not None:
        torch._mirror_autograd_meta_to(meta.original_subclass, result)  # type: ignore[attr-defined]  # private C binding present on all supported torch
    return result


def check_rebuild(t: object, path: str = "x") -> None:
    """Rebuild every level of the (nested) wrapper subclass ``t`` from its own
    flatten result with its class's ``__tensor_unflatten__`` and check the
    result: an instance of the class, with ``t``'s shape and dtype. Raises a
    ``TypeError`` naming the subclass, ``path`` and the fix; ``t`` is not changed.

    Run where torch first meets a subclass input while tracing: a wrong result
    there otherwise surfaces as a misleading tangent error in backward, or as
    a crash of the process under inductor.
    """
    if not is_wrapper_subclass(t):
        return
    names, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]  # a wrapper subclass
    inner = {name: getattr(t, name) for name in names}
    for name, value in inner.items():
        check_rebuild(value, f"{path}.{name}")
    cls = type(t)
    result = cls.__tensor_unflatten__(inner, ctx, t.size(), t.stride())  # type: ignore[attr-defined, union-attr]  # a wrapper subclass
    if not isinstance(result, cls):
        raise bad_unflatten_type(cls, result, path)
    for what in ("shape", "dtype"):
        if getattr(result, what) != getattr(t, what):
            raise TypeError(
                f"{cls.__qualname__}.__tensor_unflatten__ (rebuilding {path!r}) returned a "
                f"{cls.__qualname__} with {what} {getattr(result, what)}, but the instance it was "
                f"flattened from has {what} {getattr(t, what)}. Fix: build the result with "
                "outer_size/outer_stride and the dtype of the instance (torch.Tensor."
                "_make_wrapper_subclass(cls, outer_size, strides=outer_stride, dtype=...))."
            )


def _fill_placeholders(meta: SubclassCreationMeta, leaves: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    it = iter(leaves[meta.symint_start_idx : meta.flat_tensor_start_idx + meta.arg_count])
    size = list(meta.outer_size)
    for d in meta.size_placeholders:
        size[d] = next(it)
    stride = list(meta.outer_stride)
    for d in meta.stride_placeholders:
        stride[d] = next(it)
    return tuple(size), tuple(stride)


def unflatten_subclass(leaves: Sequence[Any], spec: SlotMeta, *, name: str = "x") -> Any:
    """Rebuild a value from ``leaves`` and the ``spec`` from :func:`flatten_subclass`.

    Every leaf is checked against its slot (tensor or opaque) and the leaf count
    against the spec, with errors that name the subclass and attribute path.
    Opaque leaves are placed into the rebuilt subclass as the very same objects.
    """
    if isinstance(spec, SubclassCreationMeta):
        start, width, owner = spec.flat_tensor_start_idx, spec.arg_count, spec.subclass_type.__qualname__
    elif isinstance(spec, (PlainTensorMeta, OpaqueMeta)):
        start, width, owner = spec.unwrapped_idx, 1, "a plain value"
    else:
        raise TypeError(
            f"unflatten_subclass expects a spec from flatten_subclass, got {describe_type(spec)}. "
            "Fix: pass the second value returned by flatten_subclass (or a meta from "
            "create_subclass_meta)."
        )
    if len(leaves) != start + width:
        detail = ""
        if isinstance(spec, SubclassCreationMeta):
            detail = f" ({spec.num_tensors} tensors, {spec.num_opaques} opaques)"
        raise ValueError(
            f"unflatten of {owner}: the spec describes {width} leaves{detail} starting at "
            f"slot {start}, but {len(leaves)} leaves were given. Fix: pass exactly the "
            "leaves flatten_subclass returned for this spec (same subclass structure)."
        )
    for path, slot in iter_slots(spec, name):
        _check_leaf(path, slot, leaves[slot.unwrapped_idx], owner)
    return build(spec, leaves, is_runtime=True, path=name)


def create_subclass_meta(
    args: Sequence[Any],
    *,
    count_symints: bool = True,
    with_memory_format: bool = False,
) -> list[SlotMeta]:
    """One meta per element of ``args``, with slots numbered across all of them.

    Subclass arguments get a :class:`SubclassCreationMeta` taking ``arg_count``
    slots; reference opaques passed directly get an :class:`OpaqueMeta`; all
    other arguments a :class:`PlainTensorMeta`. With ``count_symints``, each
    subclass's symbolic sizes/strides take slots after its attributes.
    """
    if isinstance(args, torch.Tensor) or not isinstance(args, Sequence):
        raise TypeError(
            f"create_subclass_meta expects a list or tuple of arguments, got {describe_type(args)}. "
            "Fix: wrap a single argument in a list, create_subclass_meta([x])."
        )
    metas: list[SlotMeta] = []
    idx = 0
    for i, a in enumerate(args):
        m = describe(
            a,
            idx,
            path=f"args[{i}]",
            count_symints=count_symints,
            with_memory_format=with_memory_format,
        )
        metas.append(m)
        idx += m.arg_count if isinstance(m, SubclassCreationMeta) else 1
    return metas


def flat_width(metas: Sequence[SlotMeta]) -> int:
    """Number of flat slots taken by ``metas``."""
    return sum(m.arg_count if isinstance(m, SubclassCreationMeta) else 1 for m in metas)
