"""Flattening subclasses into leaves (tensors and opaques) and back.

Built on the one walk (:mod:`opaque_subclass.core.walk`), reading each level
once: :func:`describe` builds a live value's
:class:`~opaque_subclass.core.spec.SubclassLayout`, :func:`append_leaves` lists
its leaves. Unflattening is :func:`~opaque_subclass.core.spec.unflatten_checked`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake as _is_fake_tensor

from opaque_subclass.core import messages
from opaque_subclass.core.checks import check_levels
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
    """The meta of ``x`` from slot ``start_idx``: a :class:`SubclassLayout` (recursive)
    for a wrapper subclass, an :class:`OpaqueSlot` for a reference opaque, else a
    :class:`TensorSlot`. ``path`` names ``x`` in error messages."""
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
    """The meta of one level; in the same pass, appends its leaves to ``leaves``
    and every level read (innermost first) to ``levels``, when given."""
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
    """Append ``x``'s leaves (tensors and opaques, depth-first) or ``x`` itself to
    ``out``, validating like :func:`describe`. With ``symints``, each level's
    symbolic sizes and strides follow its leaves (as ``count_symints=True``)."""
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

    Every level is validated and rebuilt once with its ``__tensor_unflatten__``,
    which must return the class with ``t``'s shape and dtype
    (:func:`~opaque_subclass.core.checks.check_rebuild`): a bad spec is refused
    here, naming the level, not later as a silently different tensor.
    :func:`append_leaves` gives the leaves alone, without the rebuild.
    """
    if not isinstance(t, _Tensor):
        raise messages.flatten_not_a_tensor(t)
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

    Leaves and their count are checked against the spec (errors name the
    subclass and attribute path); opaques go in as the very same objects.
    """
    return unflatten_checked(leaves, spec, name=name)


def describe_args(
    args: Sequence[Any],
    *,
    count_symints: bool = True,
    with_memory_format: bool = False,
) -> list[Layout]:
    """One :func:`describe` meta per element of ``args``, slots numbered across
    all; with ``count_symints``, a subclass's symbolic sizes/strides take slots
    after its attributes."""
    if isinstance(args, torch.Tensor) or not isinstance(args, Sequence):
        raise messages.describe_args_not_a_list(args)
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
