"""Every check of user input at torch's entry points: where torch.compile
(Dynamo), ``torch.export`` and the library's own API first meet a subclass.

The walk (:func:`~opaque_subclass.core.walk.read_level`) checks one level's
``__tensor_flatten__`` result on every route. Here are the checks that need the
whole input, or the moment it is met:

* :func:`validate_input`: every level of an input, walked once, and for a real
  input that ``__tensor_unflatten__`` rebuilds each level (:func:`check_levels`);
* :func:`validate_graph_input`: the same for Dynamo, once per level per graph,
  plus :func:`check_guardable_context` (a context Dynamo's guard could never
  pass: an object equal only to itself, a process group or mesh);
* the run-time helpers check arguments against the spec (:mod:`opaque_subclass.core.spec`).

The torch functions calling these per release are the rows of
``opaque_subclass/releases/v2_NN.py`` whose replacement lives in
:mod:`opaque_subclass.fixes.entry_checks` (and :mod:`opaque_subclass.backport` on torch 2.11).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, is_fake

from opaque_subclass.core import messages
from opaque_subclass.core.context import attribute_name, distributed_part, holding_attribute, unequal_to_copy
from opaque_subclass.core.registry import opaque_kind, opaque_type_of
from opaque_subclass.core.walk import Level, walk

__all__ = [
    "CheckedLevels",
    "check_fake_rebuild",
    "check_guardable_context",
    "check_levels",
    "check_rebuild",
    "check_tangent_structure",
    "require_module",
    "source_name",
    "validate_graph_input",
    "validate_input",
]


def check_rebuild(t: object, path: str = "x") -> None:
    """Rebuild every level of the (nested) wrapper subclass ``t`` from its flatten result with its
    class's ``__tensor_unflatten__`` and check the result is an instance of the class with ``t``'s
    shape and dtype; else raise a ``TypeError`` naming the subclass, ``path`` and the fix. ``t`` is
    not changed.

    Run where torch first meets a subclass input while tracing: a wrong result otherwise surfaces
    as a misleading tangent error in backward, or a process crash under inductor.
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
        raise messages.unflatten_returned_wrong_type(cls, result, path)
    _compare_rebuilt(level, result)


def _compare_rebuilt(level: Level, result: Any) -> None:
    """``result``, a rebuild of ``level``'s instance, has its shape (unless symbolic) and dtype."""
    t, path, cls = level.owner, level.path, type(level.owner)
    for what in ("shape", "dtype"):
        if what == "shape" and any(isinstance(s, torch.SymInt) for s in (*result.shape, *t.shape)):
            continue  # comparing symbolic sizes would add guards; the traced program checks them
        if getattr(result, what) != getattr(t, what):
            raise messages.rebuilt_differs(cls, path, what, getattr(result, what), getattr(t, what))


def check_guardable_context(level: Level) -> None:
    """Check that the flatten context of ``level`` equals a deep copy of itself.

    Dynamo keeps a deep copy of a subclass input's flatten context and compares later contexts
    with it by ``==`` (unless the class defines ``__metadata_guard__``). An object compared by
    identity (no ``__eq__``: a mesh, a handle) never equals its copy, and torch stops with "Guard
    failed on the same frame it was created. This is a bug". Raises a ``TypeError`` naming the
    subclass, the object's context path, its type and the fix; a context that cannot be copied or
    compared is left to torch.
    """
    owner, ctx = level.owner, level.ctx
    if ctx is None or hasattr(owner, "__metadata_guard__"):
        return
    distributed = distributed_part(ctx)
    if distributed is not None:
        as_input = _as_input_fix(level, distributed.obj, distributed.path)
        raise messages.distributed_context(type(owner), level.path, distributed.path, distributed.obj, as_input)
    try:
        part = unequal_to_copy(ctx)
    except Exception:
        return  # torch's own deepcopy or comparison fails too, and says so
    if part is None:
        return
    where, culprit = part.path, part.obj
    culprit_cls = opaque_type_of(culprit)
    as_input = _as_input_fix(level, culprit, where)
    registered = opaque_kind(culprit_cls) == "reference"
    raise messages.context_unequal_to_copy(type(owner), level.path, where, culprit, culprit_cls, registered, as_input)


def _as_input_fix(level: Level, culprit: object, path: str) -> str:
    """The fix moving ``culprit`` (at ``path`` of ``level``'s context) to the attributes, under the
    attribute holding it or else a name the instance does not use."""
    owner = level.owner
    attr = holding_attribute(owner, culprit)
    name = attr or attribute_name(opaque_type_of(culprit).__name__)
    while attr is None and (name in level.names or hasattr(owner, name)):  # a name the instance does not use
        name += "_in_context"
    return messages.list_as_attribute_fix(type(owner), level.names, attr, name, path, opaque_type_of(culprit))


def source_name(source: Any) -> str:
    """How Dynamo prints a source (``L['x']``), for the paths in error messages."""
    name = getattr(source, "name", "x")
    return str(name() if callable(name) else name)


def validate_input(t: object, path: str, *, guarded: bool = False, rebuild: bool = True) -> list[Level]:
    """Everything checked where torch first meets a subclass input while tracing, from one walk:
    every level's attributes and, with ``rebuild`` and a real input, :func:`check_rebuild`. With
    ``guarded`` (Dynamo, which keeps a deep copy of flatten contexts), also
    :func:`check_guardable_context`. Dynamo's entry passes ``rebuild=False`` and checks torch's
    fake rebuild instead (:func:`check_fake_rebuild`), running no ``__tensor_unflatten__`` torch
    would not. Returns the levels checked, outermost first (``[]`` for a non-wrapper)."""
    levels: list[Level] = []
    first_leaf: Any = None
    for _, slot in walk(t, path):  # one read per level, validated
        if isinstance(slot, Level):
            if guarded:
                check_guardable_context(slot)
            levels.append(slot)
        elif first_leaf is None and slot.kind == "tensor":
            first_leaf = slot.value
    # a subclass is fake when its tensor leaves are (the first one decides, as in torch)
    if rebuild and levels and not (first_leaf is not None and is_fake(first_leaf)):
        check_levels(levels)
    return levels


def check_fake_rebuild(levels: Sequence[Level], fake: object) -> None:
    """:func:`check_rebuild` without calling ``__tensor_unflatten__``: compare ``fake`` (torch's
    rebuild of a real input with the user's unflatten, on fake inner tensors) with the real input's
    walked ``levels`` (outermost first). Each level must be an instance of its real class with its
    shape (where not symbolic) and dtype; innermost first, with :func:`check_rebuild`'s errors."""
    if not levels:
        return
    by_path = {level.path: level for level in levels}

    def compare(level: Level, rebuilt: object) -> None:
        cls = type(level.owner)
        if not isinstance(rebuilt, cls):
            # torch's fake of a plain tensor is, for the user, a torch.Tensor
            found = "torch.Tensor" if type(rebuilt) is FakeTensor else None
            raise messages.unflatten_returned_wrong_type(cls, rebuilt, level.path, found=found)
        for attr in level.attrs:
            inner = by_path.get(attr.path)
            if inner is not None and attr.kind == "subclass":
                compare(inner, getattr(rebuilt, attr.name, None))
        _compare_rebuilt(level, rebuilt)

    compare(levels[0], fake)


class CheckedLevels(threading.local):
    """What :func:`validate_graph_input` remembers, owned by the replacement of Dynamo's
    ``wrap_tensor`` (so it goes with the patch): per thread, the output graph being built (weakly)
    and the source names of the subclass levels checked for it."""

    graph: weakref.ref[object] | None = None
    paths: set[str]


def validate_graph_input(builder: Any, value: object, checked: CheckedLevels) -> list[Level]:
    """:func:`validate_input` (``guarded``) for Dynamo's ``VariableBuilder.wrap_tensor``, once per
    subclass level per graph.

    Dynamo wraps each inner subclass again as an input (source ``L['x']._data``) after the outer
    walk checked it; a source names one object within an output graph, so one recorded in
    ``checked`` is skipped. The record is per thread and graph and holds source names only, never
    objects. Returns the levels walked (``[]`` if checked already), for :func:`check_fake_rebuild`."""
    path = source_name(builder.source)
    graph = builder.tx.output
    ref = checked.graph
    if ref is None or ref() is not graph:
        checked.graph, checked.paths = weakref.ref(graph), set()
    paths = checked.paths
    if path in paths:
        return []
    levels = validate_input(value, path, guarded=True, rebuild=False)
    paths.update(level.path for level in levels)
    return levels


def require_module(value: object, function: str, *, graph: bool = False) -> None:
    """Raise the library's ``TypeError`` unless ``value`` is a ``torch.nn.Module`` (with ``graph``: a
    ``torch.fx.GraphModule``), naming ``function``, the type and a working fix; for every public
    function taking a module, which would otherwise fail deep inside with an ``AttributeError``."""
    expected: type = torch.fx.GraphModule if graph else torch.nn.Module
    if not isinstance(value, expected):
        raise messages.not_a_module(value, function, graph)


#: How :func:`check_tangent_structure` names what a slot holds.
_SLOT_KIND = {"tensor": "tensor", "subclass": "tensor", "opaque": "opaque", "other": "other"}


def check_tangent_structure(level: Level, expected: Sequence[tuple[str, bool]]) -> None:
    """Check that a tangent lists the attributes the forward output listed, each of the same kind:
    ``expected`` is ``[(name, is_opaque), ...]`` in flatten order, ``level`` the tangent's walked
    level (``strict=False``).

    A compiled backward reads a tangent's leaves by its forward output's attribute names; a tangent
    listing other names (with an equal context, so no coercion) would give a stale attribute or fail
    inside torch. Raises :class:`~opaque_subclass.core.errors.OpaqueTypeError` naming the tangent's
    subclass, path, what it lists or holds, and the fix."""
    found = [(a.name, _SLOT_KIND[a.kind]) for a in level.attrs]
    want = [(name, "opaque" if is_opaque else "tensor") for name, is_opaque in expected]
    if found == want:
        return
    cls = type(level.owner)
    names, want_names = [n for n, _ in found], [n for n, _ in want]
    if names != want_names:
        raise messages.tangent_names_differ(cls, level.path, level.attrs, want_names)
    for (name, kind), (_, wanted), a in zip(found, want, level.attrs, strict=True):
        if kind != wanted:
            raise messages.tangent_slot_kind_differs(cls, a.path, name, a.value, wanted == "opaque")
