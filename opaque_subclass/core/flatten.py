"""Flattening subclasses into leaves (tensors and opaques) and back.

Built on the one walk (:mod:`opaque_subclass.core.walk`): :func:`describe`
builds the :class:`~opaque_subclass.core.spec.SubclassLayout` of a live
value from its levels, :func:`append_leaves` lists its leaves, and
:func:`check_rebuild` rebuilds every level with the class's own
``__tensor_unflatten__``. Each reads a level once, validated by the walk.
Unflattening is the spec's :func:`~opaque_subclass.core.spec.unflatten_checked`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake as _is_fake_tensor

from opaque_subclass.core.checks import check_levels
from opaque_subclass.core.errors import OpaqueTypeError, describe_type
from opaque_subclass.core.registry import opaque_kind, opaque_type_of
from opaque_subclass.core.spec import (
    Layout,
    OpaqueSlot,
    SubclassLayout,
    TensorSlot,
    _is_symbolic,
    unflatten_checked,
)
from opaque_subclass.core.walk import Attr, Level, is_wrapper_subclass, read_level, walk

__all__ = [
    "append_leaves",
    "describe",
    "describe_args",
    "flatten_subclass",
    "is_wrapper_subclass",
    "unflatten_subclass",
]

_Tensor = torch.Tensor


def describe(
    x: object,
    start_idx: int = 0,
    *,
    attr: str | None = None,
    path: str = "x",
    count_symints: bool = False,
    with_memory_format: bool = False,
) -> Layout:
    """Build the meta of one value whose first slot is ``start_idx``.

    A wrapper subclass gets a :class:`SubclassLayout` (recursively), a
    reference opaque an :class:`OpaqueSlot`, anything else a
    :class:`TensorSlot`. ``path`` names ``x`` in error messages.
    """
    if not is_wrapper_subclass(x):
        if not isinstance(x, _Tensor) and opaque_kind(x) == "reference":
            return OpaqueSlot(start_idx, attr, opaque_type_of(x))
        fmt = None
        if with_memory_format and isinstance(x, _Tensor):
            fmt = torch._prims_common.suggest_memory_format(x)
        return TensorSlot(start_idx, attr, fmt)
    return _describe_level(
        read_level(x, path),  # type: ignore[arg-type]  # a wrapper subclass is a tensor
        start_idx,
        attr,
        count_symints=count_symints,
        with_memory_format=with_memory_format,
    )


def _describe_level(
    level: Level,
    start_idx: int,
    attr: str | None,
    *,
    count_symints: bool,
    with_memory_format: bool,
    leaves: list[Any] | None = None,
    levels: list[Level] | None = None,
) -> SubclassLayout:
    """The meta of one level (nested levels read once each); with ``leaves``,
    the level's leaves are appended to it in the same pass, and with
    ``levels``, every level read (innermost first)."""
    attrs: dict[str, Layout] = {}
    idx = start_idx
    is_fake: bool | None = None  # decided by the first tensor leaf, as torch decides it
    for a in level.attrs:
        sub: Layout
        if a.kind == "subclass":
            sub = _describe_level(
                read_level(a.value, a.path),
                idx,
                a.name,
                count_symints=count_symints,
                with_memory_format=with_memory_format,
                leaves=leaves,
                levels=levels,
            )
            idx += sub.arg_count
            if is_fake is None:
                is_fake = sub.original_subclass is not None
        elif a.kind == "opaque":
            sub = OpaqueSlot(idx, a.name, opaque_type_of(a.value))
            idx += 1
            if leaves is not None:
                leaves.append(a.value)
        else:
            fmt = torch._prims_common.suggest_memory_format(a.value) if with_memory_format else None
            sub = TensorSlot(idx, a.name, fmt)
            idx += 1
            if is_fake is None:
                is_fake = bool(_is_fake_tensor(a.value))
            if leaves is not None:
                leaves.append(a.value)
        attrs[a.name] = sub
    if levels is not None:
        levels.append(level)
    x = level.owner
    return SubclassLayout(
        flat_tensor_start_idx=start_idx,
        attrs=attrs,
        meta=level.ctx,
        outer_size=tuple(x.size()),
        outer_stride=tuple(x.stride()),
        subclass_type=type(x),
        attr=attr,
        included_subclass_symints=count_symints,
        memory_format=torch._prims_common.suggest_memory_format(x) if with_memory_format else None,
        original_subclass=x if is_fake else None,
    )


def append_leaves(x: object, out: list[Any], path: str = "x", *, symints: bool = False) -> None:
    """Append the leaves of ``x`` to ``out``: a subclass's tensors and opaques,
    depth-first, or ``x`` itself. Validates like :func:`describe`. With
    ``symints``, each subclass's symbolic size and stride entries follow its
    leaves (the layout of a meta made with ``count_symints=True``)."""
    if not is_wrapper_subclass(x):
        out.append(x)
        return
    if not symints:
        out.extend(slot.value for _, slot in walk(x, path) if isinstance(slot, Attr))
        return
    _append_with_symints(read_level(x, path), out)  # type: ignore[arg-type]  # a wrapper subclass is a tensor


def _append_with_symints(level: Level, out: list[Any]) -> None:
    for a in level.attrs:
        if a.kind == "subclass":
            _append_with_symints(read_level(a.value, a.path), out)
        else:
            out.append(a.value)
    out.extend(s for s in level.owner.size() if _is_symbolic(s))
    out.extend(s for s in level.owner.stride() if _is_symbolic(s))


def flatten_subclass(t: torch.Tensor, *, name: str = "x") -> tuple[list[Any], Layout]:
    """Flatten ``t`` into its leaves and the meta that rebuilds it.

    Parameters
    ----------
    t
        A tensor; a traceable wrapper subclass is flattened recursively, a plain
        tensor gives ``[t]`` and a :class:`TensorSlot`.
    name
        What to call ``t`` in error messages (``x`` gives paths like ``x._mesh``).

    Returns
    -------
    leaves, spec
        ``leaves`` lists tensors and opaques in flat-slot order; opaques are the
        very objects held by ``t``. ``spec.unflatten(leaves)`` rebuilds ``t``.

    Every level is validated by the walk, and rebuilt once from its own leaves
    with its class's ``__tensor_unflatten__``, which must return an instance of
    the class with ``t``'s shape and dtype (:func:`~opaque_subclass.core.checks.check_rebuild`): a spec that
    would not rebuild ``t`` is refused here, naming the level, rather than
    surfacing later as a silently different tensor. For the leaves alone, use
    :func:`append_leaves`, which skips the rebuild.
    """
    if not isinstance(t, _Tensor):
        raise OpaqueTypeError(
            f"flatten_subclass expects a tensor, got {describe_type(t)}. Fix: pass the "
            "subclass instance; for a list of arguments use describe_args."
        )
    leaves: list[Any] = []
    if not is_wrapper_subclass(t):
        return [t], describe(t, 0, path=name)
    # one walk: the spec, the leaves and the rebuild check come from the same reads
    levels: list[Level] = []
    spec = _describe_level(
        read_level(t, name), 0, None, count_symints=False, with_memory_format=False, leaves=leaves, levels=levels
    )
    check_levels(levels)
    return leaves, spec


def unflatten_subclass(leaves: Sequence[Any], spec: Layout, *, name: str = "x") -> Any:
    """Rebuild a value from ``leaves`` and the ``spec`` from :func:`flatten_subclass`.

    Every leaf is checked against its slot (tensor or opaque) and the leaf count
    against the spec, with errors that name the subclass and attribute path.
    Opaque leaves are placed into the rebuilt subclass as the very same objects.
    """
    return unflatten_checked(leaves, spec, name=name)


def describe_args(
    args: Sequence[Any],
    *,
    count_symints: bool = True,
    with_memory_format: bool = False,
) -> list[Layout]:
    """One meta per element of ``args``, with slots numbered across all of them.

    Subclass arguments get a :class:`SubclassLayout` taking ``arg_count``
    slots; reference opaques passed directly get an :class:`OpaqueSlot`; all
    other arguments a :class:`TensorSlot`. With ``count_symints``, each
    subclass's symbolic sizes/strides take slots after its attributes.
    """
    if isinstance(args, torch.Tensor) or not isinstance(args, Sequence):
        raise OpaqueTypeError(
            f"describe_args expects a list or tuple of arguments, got {describe_type(args)}. "
            "Fix: wrap a single argument in a list, describe_args([x])."
        )
    metas: list[Layout] = []
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
        idx += m.arg_count if isinstance(m, SubclassLayout) else 1
    return metas


def flat_width(metas: Sequence[Layout]) -> int:
    """Number of flat slots taken by ``metas``."""
    return sum(m.arg_count if isinstance(m, SubclassLayout) else 1 for m in metas)
