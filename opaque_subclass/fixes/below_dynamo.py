"""What a compilation reads from opaques below Dynamo (torch 2.12 - 2.15).

While AOTAutograd traces, dispatch code and fake kernels see each opaque input
as torch's ``FakeScriptObject``, bound to its declared members
(``DeviceMesh.get_coordinate``, ``ProcessGroup.size`` ...). Such a read runs
on the real object and is compiled in, unseen by Dynamo: no guard, and no
compile-cache key (AOTAutograd keys on the class, so another process may load
the program: docs/large_jobs.md, "Limits"). DTensor's sharding propagation
reads its mesh this way.

The ``FakeScriptObject.__getattribute__`` replacement records each such read
for the compilation in progress (in the recorder, never on torch's or the
user's objects), so a ``DeviceMesh`` read rank-dependently keeps torch's guard
on its whole rank map (:mod:`opaque_subclass.fixes.mesh_guards`). While
compilations are shared across ranks (``opaque_subclass.dtensor.share_compiles``),
the *use* of a :data:`POSITION_MEMBERS` value (a coordinate element read, the
local rank taken) is recorded too
(:data:`~opaque_subclass.core.recorder.RECORDER`'s ``position_uses``), and
``share_compiles`` refuses such a graph: it computes this rank's part.

DTensor's sharding cache keys on spec hash and equality, where the fake object
equals its real mesh, so an output traced by AOTAutograd (``t * 2``) can carry
the *real* ``DeviceMesh`` and a redistribution reads its coordinate directly.
:func:`make_sym_get_coordinate` and :func:`make_get_coordinate` watch those
uses likewise, only when called from DTensor's redistributions under a fake
mode of a shared compilation (sharding propagation reads the coordinate
without depending on it; Dynamo's own real-mesh reads are guarded).

torch 2.11's fake object answers no member, so nothing is recorded there. Not
seen: code reading the fake object's ``real_obj`` itself (torch's submesh
reconstruction reads dimension names so).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch._library.fake_class_registry import FakeScriptObject

from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.fixes.autograd_cache import sharing_across_ranks
from opaque_subclass.patching import composes

__all__ = [
    "POSITION_MEMBERS",
    "REDISTRIBUTION_MODULES",
    "Read",
    "make_fake_object_getattribute",
    "make_get_coordinate",
    "make_sym_get_coordinate",
    "reads_of",
]

# The FakeScriptObject's own slots, which torch reads all the time: not members.
_OWN = frozenset({"real_obj", "wrapped_obj", "script_class_name", "__class__", "__dict__"})

#: One object's members read below Dynamo: its class and the members' names.
Read = tuple[type, frozenset[str]]

#: ``DeviceMesh`` members saying where this rank sits. Reading one (``get_coordinate()
#: is None``) is no dependence; *using* its value (indexing the coordinate) is.
POSITION_MEMBERS = frozenset(
    {"get_coordinate", "_coordinate_on_dim", "_sym_get_coordinate", "get_local_rank", "get_rank", "_rank"}
)


def reads_of(context: object | None = None) -> dict[int, Read]:
    """Members read below Dynamo by the compilation ``context`` (default: this
    thread's), by ``id()`` of the real object."""
    found: dict[int, tuple[type, set[str]]] = {}
    for key, cls, name in RECORDER.get("below_dynamo_reads", context):
        found.setdefault(key, (cls, set()))[1].add(name)
    return {key: (cls, frozenset(names)) for key, (cls, names) in found.items()}


def _note_use(context: object, real: object, name: str) -> None:
    RECORDER.add("position_uses", context, (id(real), name))


class _WatchedPosition(list):  # type: ignore[type-arg]
    """A coordinate recording its use (indexing, iterating, comparing; not ``len()``)."""

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
    """The result of calling position member ``name``, its use recorded."""
    if isinstance(result, _WatchedPosition):  # the real mesh's method watches it already
        return result
    if name == "get_coordinate" and isinstance(result, (list, tuple)):
        return _WatchedPosition(result, on_use)
    if result is not None:  # an int: the rank, a local rank, one coordinate
        on_use()
    return result


def _watched(value: Any, name: str, on_use: Callable[[], None]) -> Any:
    """``value`` of position member ``name``, its use recorded."""
    if callable(value):

        def member(*args: Any, **kwargs: Any) -> Any:
            return _watched_result(value(*args, **kwargs), name, on_use)

        return member
    if isinstance(value, (list, tuple)):
        return _WatchedPosition(value, on_use)
    on_use()
    return value


#: The function at torch's ``FakeScriptObject.__getattribute__`` when this module is
#: imported (torch's, or that of a package imported before the library), which the
#: replacement is built over: what it calls under Dynamo, which inlines the replacement
#: and guards a global it reads (a closure cell, read through the real object's
#: ``__getattribute__``, has no source a guard can evaluate).
_TORCH_GETATTRIBUTE: Callable[..., Any] = vars(FakeScriptObject).get("__getattribute__", object.__getattribute__)


@composes
def make_fake_object_getattribute(original: Callable[..., Any]) -> Any:
    """Replaces ``torch._library.fake_class_registry.FakeScriptObject.__getattribute__``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's fingerprint).

    Without it, a mesh whose coordinate a dispatch compiled in gets the narrow
    guard of :mod:`opaque_subclass.fixes.mesh_guards`, and another mesh of the
    shape runs with the first one's coordinate. With it, torch's method runs
    unchanged and each member it answers while compiling is recorded
    (:func:`reads_of`); graphs and guards stay stock torch's, input names included.
    """

    def _fake_object_getattribute(self: Any, name: str) -> Any:
        """``original``, recording reads below Dynamo (:func:`reads_of`). A Python function
        like torch's, so Dynamo inlines it as stock (2.12 names the input
        ``object_getattribute_L_..._``); under Dynamo it is :data:`_TORCH_GETATTRIBUTE`
        alone (Dynamo guards the value), which ``original`` is unless a package replaced
        torch's method after this module was imported."""
        if torch.compiler.is_dynamo_compiling():
            return _TORCH_GETATTRIBUTE(self, name)
        value = original(self, name)
        if name in _OWN:
            return value
        context = RECORDER.compilation()
        if context is None:
            return value
        real = object.__getattribute__(self, "real_obj")
        RECORDER.add("below_dynamo_reads", context, (id(real), type(real), name))
        if name in POSITION_MEMBERS and sharing_across_ranks():
            return _watched(value, name, functools.partial(_note_use, context, real, name))
        return value

    return _fake_object_getattribute


#: DTensor's redistributions, whose reads of a real mesh's position are watched
#: (they pick this rank's data). Sharding propagation's reads
#: (``compute_local_shape_and_global_offset``) change nothing with even shards.
REDISTRIBUTION_MODULES = frozenset(
    {"torch.distributed.tensor._redistribute", "torch.distributed.tensor.placement_types"}
)


def _tracing_below_dynamo() -> object | None:
    """The compilation's ``TracingContext`` while a fake mode runs below Dynamo
    and compilations are shared across ranks; else ``None`` (eager, or Dynamo's
    own guarded reads)."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None:
        return None
    context = RECORDER.compilation()
    if context is None or not sharing_across_ranks():
        return None
    return context


def _watching_real_member(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``original`` (``DeviceMesh.<name>``), recording the use of its value when
    called from :data:`REDISTRIBUTION_MODULES` under :func:`_tracing_below_dynamo`."""

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
    Shard redistribution of an output (``(t * 2).redistribute(t.device_mesh,
    [Shard(0)])``) picks this rank's chunk from the *real* mesh unrecorded, and
    another rank loading the graph returns this rank's chunk. With it, torch's
    method runs unchanged and the use is recorded (``position_uses``), so
    ``share_compiles`` refuses the graph with its named error.
    """
    return _watching_real_member(original, "_sym_get_coordinate")


@composes
def make_get_coordinate(original: Callable[..., Any]) -> Any:
    """Replaces ``torch.distributed.device_mesh.DeviceMesh.get_coordinate``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's fingerprint).

    Without it, under ``opaque_subclass.dtensor.share_compiles``, a Shard ->
    Shard redistribution of an output reads this rank's coordinate from the
    *real* mesh unrecorded, and another rank loading the graph computes this
    rank's part. With it, torch's method runs unchanged and the coordinate
    records its use when an element is read (``is None`` is no use), so
    ``share_compiles`` refuses the graph with its named error.
    """
    return _watching_real_member(original, "get_coordinate")
