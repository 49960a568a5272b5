"""What the library's fixes record while torch traces and runs, in one object.

The fixes that watch torch (members Dynamo reads, members read below Dynamo,
the use of a rank's position, nodes and objects made while tracing) write here,
and the tools that read their records (``compile_passes``, ``opaque_subclass.dtensor``,
the mesh guards) read here only. Records are kept per *key*: a compilation's
``TracingContext``, a graph node, a tracer, or a :func:`Recorder.collecting` block;
keys are held weakly, so a compilation that is gone takes its records with it.

A stream is recorded only while one of its writers (the factory of a fix row)
is installed on the running torch: :meth:`Recorder.recording` says whether it
is, and :meth:`Recorder.unobserved` why not, so a reader can say that a stage
cannot be observed instead of reporting nothing. Which writers are installed is
the activation state's to say (:mod:`opaque_subclass.activation` hands its view
over once, at import).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["RECORDER", "STREAMS", "Recorder", "Stream"]


@dataclass(frozen=True, slots=True)
class Stream:
    """One kind of record: ``list`` (in order), ``set`` (each entry once) or
    ``map`` (entry -> value); ``writers`` are the fix factories that make it
    (none: the library's own code, always recording)."""

    name: str
    shape: Literal["list", "set", "map"]
    stage: str
    writers: tuple[str, ...] = ()


def _stream(name: str, shape: Literal["list", "set", "map"], stage: str, *writers: str) -> Stream:
    return Stream(name, shape, stage, tuple(f"opaque_subclass.{w}" for w in writers))


STREAMS: dict[str, Stream] = {
    s.name: s
    for s in (
        _stream(
            "member_reads",
            "list",
            "members of opaques Dynamo read while tracing",
            "fixes.members:make_call_method",
            "fixes.members:make_getattr",
        ),
        _stream(
            "below_dynamo_reads",
            "set",
            "members of opaques read below Dynamo (AOTAutograd, DTensor's dispatch)",
            "fixes.below_dynamo:make_fake_object_getattribute",
        ),
        _stream(
            "position_uses",
            "set",
            "uses of a rank's position in a mesh below Dynamo",
            "fixes.below_dynamo:make_sym_get_coordinate",
            "fixes.below_dynamo:make_get_coordinate",
            "fixes.below_dynamo:make_fake_object_getattribute",
        ),
        _stream(
            "subclass_made_opaques",
            "map",
            "opaques read from subclasses made inside a compiled function (torch 2.11)",
            "backport.dtensor:make_dynamic_getattr",
        ),
        _stream(
            "traced_objects",
            "map",
            "reference opaques created while a graph was traced",
            "fixes.traced_opaques:make_metaclass_call",
        ),
        _stream("collectives", "list", "collectives run by the library's ops"),
    )
}


class Recorder:
    """The records of every stream, per key, behind one lock (see the module docstring)."""

    def __init__(self, streams: dict[str, Stream]) -> None:
        self.streams = streams
        self._lock = threading.Lock()
        self._by_stream: dict[str, weakref.WeakKeyDictionary[Any, Any]] = {
            name: weakref.WeakKeyDictionary() for name in streams
        }
        self._installed: Callable[[], Iterable[str]] = tuple

    @staticmethod
    def compilation() -> object | None:
        """The key of the compilation in progress on this thread (its
        ``TracingContext``), ``None`` outside one."""
        from torch._guards import TracingContext

        return TracingContext.try_get()

    def has_any(self, stream: str) -> bool:
        """Whether anything is recorded in ``stream`` (cheap: for per-node paths)."""
        return bool(self._by_stream[stream])

    def follow(self, installed: Callable[[], Iterable[str]]) -> None:
        """Read the installed fix factories from ``installed`` (the activation
        state's view); called once, when the library is imported."""
        self._installed = installed

    def installed(self, factory: str) -> bool:
        """Whether the fix row made by ``factory`` (``"opaque_subclass.fixes.x:make_y"``) is on."""
        return factory in set(self._installed())

    def recording(self, stream: str) -> bool:
        return self.unobserved(stream) is None

    def unobserved(self, stream: str) -> str | None:
        """``None`` while ``stream`` is recorded on this torch, else why it is not."""
        writers = self.streams[stream].writers
        if not writers or not set(writers).isdisjoint(self._installed()):
            return None
        return (
            f"{self.streams[stream].stage} are not recorded on torch with this library state: none of "
            f"{', '.join(w.rsplit(':', 1)[1] for w in writers)} is installed (see opaque_subclass.support())"
        )

    def _new(self, stream: str) -> Any:
        return {"list": list, "set": set, "map": dict}[self.streams[stream].shape]()

    def add(self, stream: str, key: object, entry: object) -> None:
        """Record ``entry`` under ``key`` (a list or set stream)."""
        with self._lock:
            records = self._by_stream[stream].get(key)
            if records is None:
                records = self._by_stream[stream][key] = self._new(stream)
            records.append(entry) if isinstance(records, list) else records.add(entry)

    def put(self, stream: str, key: object, entry: object, value: object) -> None:
        """Record ``entry -> value`` under ``key`` (a map stream)."""
        with self._lock:
            records = self._by_stream[stream].get(key)
            if records is None:
                records = self._by_stream[stream][key] = {}
            records[entry] = value

    def get(self, stream: str, key: object | None = None) -> Any:
        """A copy of the records under ``key`` (default: the compilation in
        progress on this thread); empty when there are none."""
        key = self.compilation() if key is None else key
        if key is None:
            return self._new(stream)
        with self._lock:
            records = self._by_stream[stream].get(key)
            return self._new(stream) if records is None else records.copy()

    def by_object(self, stream: str, key: object | None = None) -> dict[int, frozenset[str]]:
        """A set stream of ``(id(object), ..., member name)`` entries under ``key``
        (as :meth:`get`), grouped: ``id(object)`` -> the names recorded for it."""
        found: dict[int, set[str]] = {}
        for entry in self.get(stream, key):
            found.setdefault(entry[0], set()).add(entry[-1])
        return {k: frozenset(names) for k, names in found.items()}

    def lookup(self, stream: str, key: object, entry: object) -> Any:
        """The value of one entry of a map stream, ``None`` when absent (cheap:
        for the paths that run per traced node)."""
        records = self._by_stream[stream].get(key)
        return None if records is None else records.get(entry)

    def take(self, stream: str, key: object | None = None) -> Any:
        """The records under ``key`` (as :meth:`get`), taken out: the next reader
        gets only later ones."""
        key = self.compilation() if key is None else key
        if key is None:
            return self._new(stream)
        with self._lock:
            records = self._by_stream[stream].pop(key, None)
            return self._new(stream) if records is None else records

    def collecting(self, stream: str, key: object, into: list[Any]) -> None:
        """Have :meth:`broadcast` append to ``into`` while ``key`` lives or until
        :meth:`stop_collecting` (a block that sees what runs inside it)."""
        with self._lock:
            self._by_stream[stream][key] = into

    def stop_collecting(self, stream: str, key: object) -> None:
        with self._lock:
            self._by_stream[stream].pop(key, None)

    def broadcast(self, stream: str, entry: object) -> None:
        """Append ``entry`` to every open collecting block of ``stream``."""
        with self._lock:
            for records in self._by_stream[stream].values():
                records.append(entry)


#: The library's one recorder.
RECORDER = Recorder(STREAMS)
