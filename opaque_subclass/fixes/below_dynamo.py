"""What a compilation reads from opaques below Dynamo (torch 2.12 - 2.15).

While AOTAutograd traces a compiled graph, a subclass's ``__torch_dispatch__``
and a custom op's fake implementation see each opaque input as torch's
``FakeScriptObject``, onto which torch binds the members the opaque's class
declares (``DeviceMesh.get_coordinate``, ``ProcessGroup.size`` ...). A member
read there runs on the real object and its value is compiled into the graph,
but Dynamo never saw the read: no guard compares it, and torch's compile
caches do not key on it. DTensor's sharding propagation reads its mesh this
way; so does a subclass that computes with its group's size in its dispatch.

The replacement of ``FakeScriptObject.__getattribute__`` below records each
such read for the compilation in progress (keyed by its ``TracingContext``,
under a lock, never on torch's or the user's objects), so that a
``DeviceMesh`` from which the compilation read something rank-dependent keeps
torch's guard on its whole rank map (:mod:`opaque_subclass.fixes.mesh_guards`).
torch's compile caches do not see these reads either: AOTAutograd's key holds
an opaque's class, so another process may load such a program
(docs/large_jobs.md, "Limits").

While compilations are shared across ranks
(``opaque_subclass.dtensor.share_compiles``), a member that says where this
rank sits in a mesh (:data:`POSITION_MEMBERS`) is also watched for the *use*
of its value (an element of the coordinate read, the local rank taken):
:func:`position_uses_of`, which ``share_compiles`` refuses, since such a
graph computes this rank's part.

DTensor does not always read the fake object: its sharding propagation
caches each operator's output spec by the input specs' hash and equality, and
the fake object hashes and compares as its real mesh, so the output of an
operator traced by AOTAutograd (``t * 2``) gets the spec cached while Dynamo
(or AOTAutograd's metadata pass) ran the same operator on the real mesh: its
mesh is the *real* ``DeviceMesh``, and a redistribution of it reads the real
mesh's coordinate (``_sym_get_coordinate``, ``get_coordinate``), never the
fake object. The replacements of those ``DeviceMesh`` methods below
(:func:`make_sym_get_coordinate`, :func:`make_get_coordinate`) watch the use
of their values as the fake object's members are watched, while a fake mode
traces under a compilation that shares across ranks and the caller is one of
DTensor's redistributions (not its sharding propagation: even shards' local
shapes read the coordinate without depending on it); a read by the compiled
function itself (Dynamo evaluating ``mesh.get_coordinate()`` on the real
mesh, no fake mode active) is guarded, not watched.

torch 2.11's fake object answers no member (a read there fails the
compilation), so there is nothing to record on 2.11.

Not seen: code that unwraps the fake object's ``real_obj`` itself and reads
the real object (torch's submesh reconstruction does, to find a mesh's root
while tracing; it reads the dimension names).
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.fixes.autograd_cache import sharing_across_ranks
from opaque_subclass.patching import composes

__all__ = [
    "POSITION_MEMBERS",
    "REDISTRIBUTION_MODULES",
    "Read",
    "make_fake_object_getattribute",
    "make_get_coordinate",
    "make_sym_get_coordinate",
    "position_uses_of",
    "reads_of",
]

# The FakeScriptObject's own slots, which torch reads all the time: not members.
_OWN = frozenset({"real_obj", "wrapped_obj", "script_class_name", "__class__", "__dict__"})

#: One object's members read below Dynamo: its class and the members' names.
Read = tuple[type, frozenset[str]]

# Per compilation in progress (its TracingContext, a weak key: a context that is
# gone takes its reads with it): id() of each real object read -> (class, names).
_READS: weakref.WeakKeyDictionary[object, dict[int, tuple[type, set[str]]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()

#: Members of ``DeviceMesh`` that say where this rank sits in the mesh. Reading
#: one is not yet depending on it (DTensor asks ``get_coordinate() is None`` to
#: learn whether the rank takes part at all); *using* its value is (indexing the
#: coordinate picks this rank's chunk in a Replicate -> Shard redistribution).
POSITION_MEMBERS = frozenset(
    {"get_coordinate", "_coordinate_on_dim", "_sym_get_coordinate", "get_local_rank", "get_rank", "_rank"}
)

# Per compilation in progress, as _READS: id() of each real object -> the
# position members whose values the traced code used (while sharing compilations).
_USES: weakref.WeakKeyDictionary[object, dict[int, set[str]]] = weakref.WeakKeyDictionary()


def _tracing_context() -> object | None:
    from torch._guards import TracingContext

    return TracingContext.try_get()


def reads_of(context: object | None = None) -> dict[int, Read]:
    """The members read below Dynamo by the compilation whose ``TracingContext``
    is ``context`` (by default the one in progress on this thread), by
    ``id()`` of the real object read."""
    context = _tracing_context() if context is None else context
    if context is None:
        return {}
    with _LOCK:
        return {key: (cls, frozenset(names)) for key, (cls, names) in _READS.get(context, {}).items()}


def position_uses_of(context: object | None = None) -> dict[int, frozenset[str]]:
    """The :data:`POSITION_MEMBERS` whose values the compilation whose
    ``TracingContext`` is ``context`` used below Dynamo, by ``id()`` of the real
    object; recorded only while compilations are shared across ranks
    (``opaque_subclass.dtensor.share_compiles``)."""
    context = _tracing_context() if context is None else context
    if context is None:
        return {}
    with _LOCK:
        return {key: frozenset(names) for key, names in _USES.get(context, {}).items()}


def _note_use(context: object, real: object, name: str) -> None:
    with _LOCK:
        _USES.setdefault(context, {}).setdefault(id(real), set()).add(name)


class _WatchedPosition(list):  # type: ignore[type-arg]
    """A coordinate (a list of ints) that records its first use: an element
    read, an iteration, a comparison of values. ``is None`` and ``len()`` are
    not uses."""

    __slots__ = ("_on_use",)

    def __init__(self, values: Any, on_use: Callable[[], None]) -> None:
        super().__init__(list.__iter__(values) if isinstance(values, list) else values)  # copying is no use
        self._on_use = on_use

    def __getitem__(self, index: Any) -> Any:
        self._on_use()
        return super().__getitem__(index)

    def __iter__(self) -> Any:
        self._on_use()
        return super().__iter__()

    def __eq__(self, other: object) -> bool:
        self._on_use()
        return list(self) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None


def _watched_result(result: Any, name: str, on_use: Callable[[], None]) -> Any:
    """The result of calling the position member ``name``, as the traced code
    gets it, with its use recorded."""
    if isinstance(result, _WatchedPosition):  # the real mesh's method watches it already
        return result
    if name == "get_coordinate" and isinstance(result, (list, tuple)):
        return _WatchedPosition(result, on_use)
    if result is not None:  # an int: the rank, a local rank, one coordinate
        on_use()
    return result


def _watched(value: Any, name: str, on_use: Callable[[], None]) -> Any:
    """``value`` of the position member ``name``, as the traced code gets it,
    with its use recorded."""
    if callable(value):

        def member(*args: Any, **kwargs: Any) -> Any:
            return _watched_result(value(*args, **kwargs), name, on_use)

        return member
    if isinstance(value, (list, tuple)):
        return _WatchedPosition(value, on_use)
    on_use()
    return value


#: torch's ``FakeScriptObject.__getattribute__`` (or what another package put
#: in its place), set by :func:`make_fake_object_getattribute`. A module global,
#: not a closure: Dynamo inlines the replacement (below) and reaches this through
#: a global, whose guard it can evaluate; a closure's source would be read
#: through the real object's ``__getattribute__``, which is ``object``'s.
_TORCH_GETATTRIBUTE: Callable[..., Any] = object.__getattribute__


def _fake_object_getattribute(self: Any, name: str) -> Any:
    """``FakeScriptObject.__getattribute__``: torch's, with each member read
    while a compilation traces below Dynamo recorded (:func:`reads_of`).

    A Python function, as torch's is, so Dynamo traces a read of an opaque's
    member as stock torch does (it inlines a class's ``__getattribute__`` only
    when it is a Python function; torch 2.12 names such a graph input
    ``object_getattribute_L_..._`` after the call it traces). While Dynamo
    traces, the function is torch's alone: Dynamo reads the fake object, and
    the member's value is guarded by Dynamo, not recorded here.
    """
    if torch.compiler.is_dynamo_compiling():
        return _TORCH_GETATTRIBUTE(self, name)
    value = _TORCH_GETATTRIBUTE(self, name)
    if name in _OWN:
        return value
    context = _tracing_context()
    if context is None:
        return value
    real = object.__getattribute__(self, "real_obj")
    with _LOCK:
        _READS.setdefault(context, {}).setdefault(id(real), (type(real), set()))[1].add(name)
    if name in POSITION_MEMBERS and sharing_across_ranks():
        return _watched(value, name, functools.partial(_note_use, context, real, name))
    return value


@composes
def make_fake_object_getattribute(original: Callable[..., Any]) -> Any:
    """Replaces ``torch._library.fake_class_registry.FakeScriptObject.__getattribute__``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's fingerprint).

    Without it, nothing tells a member read below Dynamo from no read at all:
    a mesh whose coordinate a subclass's dispatch compiled in would get the
    narrow guard of :mod:`opaque_subclass.fixes.mesh_guards`, and another mesh
    of the shape would run with the first one's coordinate. With it, torch's
    method runs unchanged and each member it answers while a compilation
    traces is recorded (:func:`reads_of`); Dynamo traces the replacement as it
    traces torch's method (:func:`_fake_object_getattribute`), so the graph and
    guards of a program that reads an opaque's attribute are stock torch's, input
    names included.
    """
    global _TORCH_GETATTRIBUTE
    _TORCH_GETATTRIBUTE = original
    return _fake_object_getattribute


#: The modules of DTensor whose reads of a real mesh's position are watched: the
#: redistributions, which pick this rank's data (its chunk, its part of a new
#: shard dimension). Sharding propagation also reads the real mesh's coordinate
#: (``compute_local_shape_and_global_offset`` for an operator's shape argument,
#: in every tensor-parallel backward), and with even shards its value changes
#: nothing: watching it there would refuse programs every rank can share.
REDISTRIBUTION_MODULES = frozenset(
    {"torch.distributed.tensor._redistribute", "torch.distributed.tensor.placement_types"}
)


def _tracing_below_dynamo() -> object | None:
    """The ``TracingContext`` of the compilation in progress while a fake mode
    runs code below Dynamo (AOTAutograd tracing, Dynamo running an operator on
    fake values) and compilations are shared across ranks; ``None`` otherwise:
    eager code, and Dynamo evaluating a member for the compiled function itself
    (which it guards on the value read)."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None:
        return None
    context = _tracing_context()
    if context is None or not sharing_across_ranks():
        return None
    return context


def _watching_real_member(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``DeviceMesh``'s method ``name`` (``original``) that watches the use of
    its value on the real mesh while a shared compilation traces below Dynamo,
    called from DTensor's redistributions (:data:`REDISTRIBUTION_MODULES`),
    recorded for that mesh as a use through its fake object is."""

    @functools.wraps(original)
    def member(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        context = _tracing_below_dynamo()
        if context is None or sys._getframe(1).f_globals.get("__name__") not in REDISTRIBUTION_MODULES:
            return result
        return _watched_result(result, name, functools.partial(_note_use, context, self, name))

    return member


@composes
def make_sym_get_coordinate(original: Callable[..., Any]) -> Any:
    """Replaces ``torch.distributed.device_mesh.DeviceMesh._sym_get_coordinate``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's fingerprint).

    Without it, under ``opaque_subclass.dtensor.share_compiles``, a Replicate ->
    Shard redistribution of an operator's output in the compiled function
    (``(t * 2).redistribute(t.device_mesh, [Shard(0)])``) picks this rank's
    chunk from the *real* mesh (the output's spec comes from DTensor's sharding
    cache, filled while the operator ran on the real mesh): nothing records the
    use, the graph is compiled with this rank's chunk, and another rank of the
    job loads it from the cache and returns this rank's chunk. With it, torch's
    method runs unchanged and the use of its value by DTensor's redistributions
    while such a compilation traces below Dynamo is recorded
    (:func:`position_uses_of`), so ``share_compiles`` refuses the graph with
    its named error.
    """
    return _watching_real_member(original, "_sym_get_coordinate")


@composes
def make_get_coordinate(original: Callable[..., Any]) -> Any:
    """Replaces ``torch.distributed.device_mesh.DeviceMesh.get_coordinate``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's fingerprint).

    Without it, under ``opaque_subclass.dtensor.share_compiles``, a Shard ->
    Shard redistribution to another dimension of an operator's output in the
    compiled function reads this rank's coordinate from the *real* mesh (the
    output's spec comes from DTensor's sharding cache) unrecorded, and the graph
    another rank loads computes this rank's part. With it, torch's method runs
    unchanged and the coordinate it returns to DTensor's redistributions while
    such a compilation traces below Dynamo records its use when an element is read
    (``get_coordinate() is None`` is no use), so ``share_compiles`` refuses the
    graph with its named error.
    """
    return _watching_real_member(original, "get_coordinate")
