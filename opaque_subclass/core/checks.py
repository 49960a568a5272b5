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

from opaque_subclass.core.context import (
    ContextPart,
    attribute_name,
    distributed_part,
    holding_attribute,
    unequal_to_copy,
)
from opaque_subclass.core.errors import OpaqueTypeError, adopt_fix, describe_type, import_fix, subject
from opaque_subclass.core.registry import opaque_kind, opaque_type_of
from opaque_subclass.core.spec import bad_unflatten_type
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
        raise bad_unflatten_type(cls, result, path)
    _compare_rebuilt(level, result)


def _compare_rebuilt(level: Level, result: Any) -> None:
    """``result``, a rebuild of ``level``'s instance, has its shape (unless symbolic) and dtype."""
    t, path, cls = level.owner, level.path, type(level.owner)
    for what in ("shape", "dtype"):
        if what == "shape" and any(isinstance(s, torch.SymInt) for s in (*result.shape, *t.shape)):
            continue  # comparing symbolic sizes would add guards; the traced program checks them
        if getattr(result, what) != getattr(t, what):
            raise OpaqueTypeError(
                f"{subject(cls)}.__tensor_unflatten__ (rebuilding {path!r}) returned a "
                f"{cls.__qualname__} with {what} {getattr(result, what)}, but the instance it was "
                f"flattened from has {what} {getattr(t, what)}. Fix: build the result with "
                "outer_size/outer_stride and the dtype of the instance (torch.Tensor."
                "_make_wrapper_subclass(cls, outer_size, strides=outer_stride, dtype=...))."
            )


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
    as_input = _as_input_fix(level, culprit, where)
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
    raise OpaqueTypeError(
        f"{subject(cls)}.__tensor_flatten__() at {level.path!r} returns a flatten context whose "
        f"<context>{where} holds {describe_type(culprit)}, which is not equal to a copy of itself ({why}). "
        "torch.compile guards the context by comparing it with a deep copy, so "
        "that guard could never pass (torch: 'Guard failed on the same frame it was created'). "
        f"Fix: {fix}."
    )


def _as_input_fix(level: Level, culprit: object, path: str) -> str:
    """The fix moving ``culprit`` (at ``path`` of ``level``'s context) to the attributes: by the
    class's owner, or by adopting the class."""
    owner = level.owner
    attr = holding_attribute(owner, culprit)
    listed = f"`return {[*level.names, attr]!r}, <the context without it>`" if attr else "its attribute name"
    name = attr or attribute_name(opaque_type_of(culprit).__name__)
    while attr is None and (name in level.names or hasattr(owner, name)):  # a name the instance does not use
        name += "_in_context"
    return (
        f"list it among the attributes: return {listed} from {type(owner).__qualname__}.__tensor_flatten__ and "
        "read it from inner_tensors in __tensor_unflatten__ (a graph input, passed by identity); "
        + adopt_fix(type(owner), name, path, opaque_type_of(culprit))
    )


def _refuse_distributed_context(level: Level, part: ContextPart) -> None:
    """Raise the named error for a ``ProcessGroup`` or ``DeviceMesh`` in a flatten context."""
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
        + f", and {_as_input_fix(level, culprit, part.path)}"
    )
    raise OpaqueTypeError(
        f"{subject(type(level.owner))}.__tensor_flatten__() at {level.path!r} returns a flatten context whose "
        f"<context>{part.path} holds {describe_type(culprit)}, a communicator of this job, not a constant: {why}. "
        f"Fix: {fix}."
    )


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
            raise bad_unflatten_type(cls, rebuilt, level.path, found=found)
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
    if isinstance(value, expected):
        return
    found = describe_type(value)
    package = function.rpartition(".")[0]
    if graph:
        fix = (
            "pass the graph module a torch.compile backend receives, or trace one, "
            f"`import torch, {package}; gm = torch.fx.symbolic_trace(model); {function}(gm)` "
            "(model: your torch.nn.Module)"
        )
    elif isinstance(value, type) and issubclass(value, torch.nn.Module):
        fix = f"pass an instance, not the class, `import {package}; {function}({value.__qualname__}(...))`"
    elif isinstance(value, torch.Tensor):
        fix = (
            f"hold the tensor in a module first, `import torch, {package}; module = torch.nn.Module(); "
            f"module.weight = torch.nn.Parameter(t, requires_grad=t.requires_grad); {function}(module)` "
            "(t: your tensor)"
        )
    elif isinstance(value, (list, tuple)) and value and all(isinstance(m, torch.nn.Module) for m in value):
        fix = (
            f"pass one module, `import torch, {package}; {function}(torch.nn.ModuleList(modules))` (modules: your list)"
        )
    else:
        fix = f"pass the module itself, `import {package}; {function}(model)` (model: your torch.nn.Module)"
    what = "a torch.fx.GraphModule" if graph else "a torch.nn.Module"
    raise OpaqueTypeError(f"{function} expects {what}, got {found}. Fix: {fix}.")


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
    fix = (
        "Fix: give backward a gradient with the output's attributes, `out.backward(torch.ones_like(out))` "
        "(out: the function's output; ones_like dispatches through the subclass and keeps them), or define "
        f"{cls.__qualname__}.__coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None) "
        "returning such a tangent."
    )
    names, want_names = [n for n, _ in found], [n for n, _ in want]
    if names != want_names:
        gone = [n for n in want_names if n not in names]
        extra = [a for a in level.attrs if a.name not in want_names]
        held = ", ".join(f"{a.path!r} holding {describe_type(a.value)}" for a in extra)
        raise OpaqueTypeError(
            f"tangent {level.path!r} is a {subject(cls)} whose __tensor_flatten__() lists {names!r}, but the "
            f"forward output it is the gradient of listed {want_names!r} (with an equal flatten context): "
            "backward reads a tangent's leaves by the output's attribute names, so it would "
            + (
                f"read {', '.join(repr(f'{level.path}.{n}') for n in gone)} instead of what the tangent lists"
                if gone
                else "misplace them"
            )
            + (f" and drop {held}" if held else "")
            + f". {fix}"
        )
    for (name, kind), (_, wanted), a in zip(found, want, level.attrs, strict=True):
        if kind != wanted:
            expectation = "a reference opaque" if wanted == "opaque" else "a tensor"
            raise OpaqueTypeError(
                f"tangent {a.path!r} ({subject(cls)}.__tensor_flatten__() lists {name!r}) holds "
                f"{describe_type(a.value)}, but the forward output held {expectation} there: backward "
                f"would pass it to the graph in {expectation}'s slot. {fix}"
            )
