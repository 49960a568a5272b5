"""Flattening subclasses into leaves (tensors and opaques) and back.

Built on the one walk (:mod:`opaque_subclass.core.walk`): :func:`describe`
builds the :class:`~opaque_subclass.core.spec.SubclassCreationMeta` of a live
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

from opaque_subclass.core.context import ContextPart, distributed_part, unequal_to_copy
from opaque_subclass.core.errors import describe_type, import_fix, subject
from opaque_subclass.core.registry import opaque_kind, opaque_type_of
from opaque_subclass.core.spec import (
    OpaqueMeta,
    PlainTensorMeta,
    SlotMeta,
    SubclassCreationMeta,
    _is_symbolic,
    bad_unflatten_type,
    unflatten_checked,
)
from opaque_subclass.core.walk import Attr, Level, is_wrapper_subclass, read_level, walk

__all__ = [
    "append_leaves",
    "check_guardable_context",
    "create_subclass_meta",
    "describe",
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
) -> SubclassCreationMeta:
    """The meta of one level (nested levels read once each); with ``leaves``,
    the level's leaves are appended to it in the same pass, and with
    ``levels``, every level read (innermost first)."""
    attrs: dict[str, SlotMeta] = {}
    idx = start_idx
    is_fake: bool | None = None  # decided by the first tensor leaf, as torch decides it
    for a in level.attrs:
        sub: SlotMeta
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
            sub = OpaqueMeta(idx, a.name, opaque_type_of(a.value))
            idx += 1
            if leaves is not None:
                leaves.append(a.value)
        else:
            fmt = torch._prims_common.suggest_memory_format(a.value) if with_memory_format else None
            sub = PlainTensorMeta(idx, a.name, fmt)
            idx += 1
            if is_fake is None:
                is_fake = bool(_is_fake_tensor(a.value))
            if leaves is not None:
                leaves.append(a.value)
        attrs[a.name] = sub
    if levels is not None:
        levels.append(level)
    x = level.owner
    return SubclassCreationMeta(
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

    Every level is validated by the walk, and rebuilt once from its own leaves
    with its class's ``__tensor_unflatten__``, which must return an instance of
    the class with ``t``'s shape and dtype (:func:`check_rebuild`): a spec that
    would not rebuild ``t`` is refused here, naming the level, rather than
    surfacing later as a silently different tensor. For the leaves alone, use
    :func:`append_leaves`, which skips the rebuild.
    """
    if not isinstance(t, _Tensor):
        raise TypeError(
            f"flatten_subclass expects a tensor, got {describe_type(t)}. Fix: pass the "
            "subclass instance; for a list of arguments use create_subclass_meta."
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


def check_rebuild(t: object, path: str = "x") -> None:
    """Rebuild every level of the (nested) wrapper subclass ``t`` from its own
    flatten result with its class's ``__tensor_unflatten__`` and check the
    result: an instance of the class, with ``t``'s shape and dtype. Raises a
    ``TypeError`` naming the subclass, ``path`` and the fix; ``t`` is not changed.

    Run where torch first meets a subclass input while tracing: a wrong result
    there otherwise surfaces as a misleading tangent error in backward, or as
    a crash of the process under inductor.
    """
    check_levels([slot for _, slot in walk(t, path) if isinstance(slot, Level)])


def check_levels(levels: Sequence[Level]) -> None:
    """:func:`check_rebuild` for levels already read by the walk (innermost first)."""
    for level in reversed(levels):
        _check_level(level)


def _check_level(level: Level) -> None:
    t, path, cls = level.owner, level.path, type(level.owner)
    inner = {a.name: a.value for a in level.attrs}
    result = cls.__tensor_unflatten__(inner, level.ctx, t.size(), t.stride())  # type: ignore[attr-defined]  # a wrapper subclass
    if not isinstance(result, cls):
        raise bad_unflatten_type(cls, result, path)
    for what in ("shape", "dtype"):
        if what == "shape" and any(isinstance(s, torch.SymInt) for s in (*result.shape, *t.shape)):
            continue  # comparing symbolic sizes would add guards; the traced program checks them
        if getattr(result, what) != getattr(t, what):
            raise TypeError(
                f"{subject(cls)}.__tensor_unflatten__ (rebuilding {path!r}) returned a "
                f"{cls.__qualname__} with {what} {getattr(result, what)}, but the instance it was "
                f"flattened from has {what} {getattr(t, what)}. Fix: build the result with "
                "outer_size/outer_stride and the dtype of the instance (torch.Tensor."
                "_make_wrapper_subclass(cls, outer_size, strides=outer_stride, dtype=...))."
            )


def check_guardable_context(level: Level) -> None:
    """Check that the flatten context of ``level`` equals a deep copy of itself.

    Dynamo guards a subclass input on its flatten context: it keeps a deep copy
    and compares every later context with it by ``==`` (unless the class
    defines ``__metadata_guard__``). An object in the context compared by
    identity (its class defines no ``__eq__``, a mesh or a handle) is never
    equal to its copy, and torch stops at once with "Guard failed on the same
    frame it was created. This is a bug". Raises a ``TypeError`` naming the
    subclass, the object's path in the context, its type and the fix. A context
    that cannot be copied or compared is left to torch, which reports it.
    """
    owner, ctx = level.owner, level.ctx
    if ctx is None or hasattr(owner, "__metadata_guard__"):
        return
    distributed = distributed_part(ctx)
    if distributed is not None:
        _refuse_distributed_context(level, distributed)
    try:
        part = unequal_to_copy(ctx)
    except Exception:
        return  # torch's own deepcopy or comparison fails too, and says so
    if part is None:
        return
    where, culprit = part.path, part.obj
    cls = type(owner)
    culprit_cls = opaque_type_of(culprit)
    as_input = _as_input_fix(level, culprit)
    if opaque_kind(culprit_cls) == "reference":
        fix = as_input
    else:
        shown = culprit_cls.__name__
        fix = (
            "register its class, "
            + import_fix(culprit_cls, 'opaque_subclass.register_opaque({cls}, kind="reference")')
            + f", and {as_input}; or, if it is a constant, give {shown} value equality: define "
            "`def __eq__(self, other): return type(other) is type(self) and vars(other) == vars(self)` and "
            "`def __hash__(self): return hash(type(self))` in its class (or define __metadata_guard__ on "
            f"{cls.__qualname__})"
        )
    eq: Any = type(culprit).__eq__
    why = "it compares by identity" if eq is object.__eq__ else "its __eq__ says so"
    raise TypeError(
        f"{subject(cls)}.__tensor_flatten__() at {level.path!r} returns a flatten context whose "
        f"<context>{where} holds {describe_type(culprit)}, which is not equal to a copy of itself ({why}). "
        "torch.compile guards the context by comparing it with a deep copy, so "
        "that guard could never pass (torch: 'Guard failed on the same frame it was created'). "
        f"Fix: {fix}."
    )


def _as_input_fix(level: Level, culprit: object) -> str:
    """The fix that moves ``culprit`` from ``level``'s context to its attributes."""
    owner = level.owner
    try:  # the instance attribute holding the object, if any (read from __dict__, nothing called)
        attr = next((n for n, v in vars(owner).items() if v is culprit), None)
    except Exception:
        attr = None
    listed = f"`return {[*level.names, attr]!r}, <the context without it>`" if attr else "its attribute name"
    return (
        f"list it among the attributes: return {listed} from {type(owner).__qualname__}.__tensor_flatten__ and "
        "read it from inner_tensors in __tensor_unflatten__ (a graph input, passed by identity)"
    )


def _refuse_distributed_context(level: Level, part: ContextPart) -> None:
    """Raise the named error for a ``ProcessGroup`` or ``DeviceMesh`` found in a
    flatten context (:func:`check_guardable_context`)."""
    culprit = part.obj
    culprit_cls = type(culprit)
    if not any(klass.__name__ == "DeviceMesh" for klass in culprit_cls.__mro__):
        why = (
            "torch.compile guards the context by comparing it with a deep copy, and a process group "
            "cannot be copied (torch: 'cannot pickle ... ProcessGroup' while building guards)"
        )
    else:
        why = (
            "torch.compile guards the context by ==, and a mesh's == compares its ranks and layout, not "
            "its process groups: a later call with another, equal mesh would run with the first call's mesh"
        )
    # The registration is a no-op where torch (or the user) registered the class already.
    fix = (
        "make it an opaque attribute: register its class (as torch 2.12+ registers it), "
        + import_fix(culprit_cls, "opaque_subclass.register_opaque({cls})")
        + f", and {_as_input_fix(level, culprit)}"
    )
    raise TypeError(
        f"{subject(type(level.owner))}.__tensor_flatten__() at {level.path!r} returns a flatten context whose "
        f"<context>{part.path} holds {describe_type(culprit)}, a communicator of this job, not a constant: {why}. "
        f"Fix: {fix}."
    )


def unflatten_subclass(leaves: Sequence[Any], spec: SlotMeta, *, name: str = "x") -> Any:
    """Rebuild a value from ``leaves`` and the ``spec`` from :func:`flatten_subclass`.

    Every leaf is checked against its slot (tensor or opaque) and the leaf count
    against the spec, with errors that name the subclass and attribute path.
    Opaque leaves are placed into the rebuilt subclass as the very same objects.
    """
    return unflatten_checked(leaves, spec, name=name)


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
