"""Lint OSC004: values read from an opaque while tracing, compiled into the graph.

Note [Two places a member value is baked]
-----------------------------------------
A member of an opaque evaluated on the real object while tracing (``size()``,
``rank()``, ``group_name``, a mesh coordinate) gives a Python value the graph is
built from: ``x / 2`` rather than ``x / g.size()``. It happens in two places,
and only the first can be guarded:

* **in the compiled function, as Dynamo traces it** (``t._group.size()``): the
  library's member fix (:mod:`opaque_subclass.fixes.members`) records every such
  read and guards the value when the opaque has a source (an input: one
  compilation per distinct value). An opaque made inside the graph has no
  source: its baked value serves every later call that passes the other guards.
* **below Dynamo**, while AOTAutograd traces: a subclass's
  ``__torch_dispatch__`` or ``__tensor_unflatten__``, or a custom op's fake
  implementation, runs with the real opaque (``x / self._group.size()``).
  Nothing guards such a value, except for a type registered with a guard
  (``DeviceMesh``: ranks, layout and names compared on every call).

The first kind is recorded for free by the fix. The second is found by
:class:`ReadWatcher`, a ``sys.setprofile`` hook (this thread only) while the
inner backend compiles, which sees each call of a method (C or Python) or
property of the graph's opaque types, and each attribute read through torch's
fake wrapper of an opaque, from code outside torch and the library's
replacements of torch functions. It makes an ``aot_eager`` compilation 1.7 to
1.8 times as long (``benchmarks/bench_opaque_check.py``, torch 2.11 and 2.15),
so the checking backend watches only with ``watch_reads=True``; ``explain``
asks. An attribute (``pg.group_name``) read on the real object fires no
profiling event and is seen only through the fake wrapper, which AOTAutograd's
later passes give ``__torch_dispatch__``. Reads by torch's own code (DTensor's
dispatch reads its mesh; funcol resolves a group's name) are left out.

Each finding's fix is code with the program's names: a custom op that takes the
opaque and reads the member when the graph runs, and the expression it replaces.
"""

from __future__ import annotations

import inspect
import linecache
import logging
import os
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import torch

import opaque_subclass
from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.core.registry import opaque_kind, real_object
from opaque_subclass.core.walk import Attr, Level, is_wrapper_subclass, walk
from opaque_subclass.fixes.members import MemberRead, member_guard_text

from . import messages
from .collectives import BakedGroup, collective_below, packet_call_code
from .findings import Finding, make
from .guards import graph_input_name

__all__ = ["BakedRead", "ReadWatcher", "lint_reads", "read_fix", "traced_reads"]

_log = logging.getLogger(__name__)

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

#: Where a read happened: in the compiled function as Dynamo traced it, or below Dynamo.
Stage = Literal["dynamo", "below dynamo"]


@dataclass(frozen=True, slots=True)
class BakedRead:
    """A member of an opaque evaluated on the real object while a graph was traced.

    Attributes
    ----------
    stage
        ``"dynamo"`` (in the compiled function) or ``"below dynamo"`` (while AOTAutograd traced the
        graph: a subclass's ``__torch_dispatch__``, a custom op's fake implementation).
    owner, member
        The opaque's class and the member's name.
    call
        Whether it is called (a method) or read (an attribute).
    args
        The call's arguments as written in a guard (``"0, dim=1"``), ``""`` for none.
    value, known
        The value compiled in, and whether it is known (below Dynamo only for a ``USE_REAL`` member
        called without arguments, which is re-evaluated).
    path
        The opaque's input path (``t._group``), ``None`` when it is not an input.
    receiver
        How the code names the opaque at that line (``g``, ``self._group``), or ``None``.
    subclass
        Qualified name of the subclass input holding the opaque, or ``None``.
    file, line, function, code
        Where the member is used: the innermost frame outside torch.
    guarded, guard
        Whether a guard compares the value on every call, and what guards it
        (``t._group.size() == 4``, ``DeviceMesh's registered guard``), or ``None``.
    """

    stage: Stage
    owner: type
    member: str
    call: bool
    args: str
    value: object
    known: bool
    path: str | None
    receiver: str | None
    subclass: str | None
    file: str
    line: int
    function: str
    code: str
    guarded: bool
    guard: str | None

    @property
    def expression(self) -> str:
        """The read as the code writes it (``g.size()``), else on its input path."""
        base = self.receiver or self.path or f"<{self.owner.__name__}>"
        return f"{base}.{self.member}" + (f"({self.args})" if self.call else "")

    @property
    def on_input(self) -> str | None:
        """The read on the opaque's input path (``t._group.size()``), or ``None``."""
        if self.path is None:
            return None
        return f"{self.path}.{self.member}" + (f"({self.args})" if self.call else "")

    @property
    def origin(self) -> str:
        """``file:line in function: code``, as the other lints name a line."""
        return messages.origin(self.file, self.line, self.function, self.code)

    def __str__(self) -> str:
        value, aside = messages.read_value(self.value, self.known), messages.input_aside(self.path, self.receiver)
        in_dynamo = self.stage == "dynamo"
        return messages.read_line(self.expression, aside, value, in_dynamo, self.origin, self.guarded, self.guard)


class _Place(TypedDict):
    """Where a member is used: a :class:`BakedRead`'s ``file``, ``line``, ``function`` and ``code``."""

    file: str
    line: int
    function: str
    code: str


def _place(file: str, line: int, function: str) -> _Place:
    """The line ``line`` of ``file``, in ``function``, with its source."""
    return _Place(file=file, line=line, function=function, code=linecache.getline(file, line).strip())


# ------------------------------------------------------------------ the graph's opaque inputs


def _opaque_inputs(named: Sequence[tuple[str, Any]]) -> Iterator[tuple[str, object, str | None]]:
    """``(path, real object, qualified name of the subclass holding it)`` for
    each reference opaque among a graph's inputs (nested in subclasses too)."""
    for name, value in named:
        if is_wrapper_subclass(value):
            owners: dict[str, str] = {}
            try:
                for path, slot in walk(value, name):
                    if isinstance(slot, Level):
                        owners[path] = qualified_name(type(slot.owner))
                    elif isinstance(slot, Attr) and slot.kind == "opaque":
                        real = real_object(slot.value)
                        if opaque_kind(real) == "reference":
                            yield path, real, owners.get(path.rsplit(".", 1)[0])
            except Exception as error:  # a report must not fail on what it reports about
                _log.debug("compile_passes: no opaque walk of %s: %s", name, error)
        elif value is not None and not isinstance(value, torch.Tensor):
            real = real_object(value)
            if opaque_kind(real) == "reference":
                yield name, real, None


def _guard_of(cls: type) -> bool:
    """Whether ``cls`` (or a base) is registered with a ``guard_fn`` (its values
    are compared on every call: torch's ``DeviceMesh``)."""
    from torch._library import opaque_object

    table = opaque_object._OPAQUE_TYPES
    for klass in cls.__mro__:
        info = table.get(klass)
        if info is not None:
            return getattr(info, "guard_fn", None) is not None
    return False


def _use_real(cls: type, member: str) -> bool:
    from torch._library.opaque_object import MemberType, get_member_type

    return bool(get_member_type(cls, member) == MemberType.USE_REAL)


# ------------------------------------------------------------------ kind (a): Dynamo's reads


def traced_reads(named: Sequence[tuple[str, Any]], records: Iterable[MemberRead] | None = None) -> list[BakedRead]:
    """The reads Dynamo made while tracing the compiled function (recorded by
    the library's member fix; by default those of the compilation in progress,
    taken from the record), as :class:`BakedRead` s. Reads made by torch's own
    code (their innermost traced frame is in torch) are left out."""
    records = RECORDER.take("member_reads") if records is None else list(records)
    if not records:
        return []
    owners = {path: owner for path, _, owner in _opaque_inputs(named)}
    reads = []
    for record in records:
        if not record.frames:
            continue
        file, line, function = record.frames[0]
        if os.path.abspath(file).startswith(_TORCH_DIR):
            continue
        path = _input_path(record.path) if record.path is not None else None
        args = ", ".join([repr(a) for a in record.args] + [f"{k}={v!r}" for k, v in record.kwargs])
        guard = None
        if record.guarded and path is not None:
            kwargs = dict(record.kwargs)
            guard = (
                member_guard_text(path, record.member, record.args, kwargs, record.value)
                if record.call
                else messages.attribute_guard(path, record.member, record.value)
            )
        place = _place(file, line, function)
        reads.append(
            BakedRead(
                stage="dynamo",
                owner=record.owner,
                member=record.member,
                call=record.call,
                args=args,
                value=record.value,
                known=record.known,
                path=path,
                receiver=_receiver(place["code"], record.member, path) or path,
                subclass=owners.get(path) if path is not None else None,
                **place,
                guarded=record.guarded,
                guard=guard,
            )
        )
    return reads


_NAME = r"[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*|\[[^\[\]()]*\])*"


def unobserved_reads(named: Sequence[tuple[str, Any]], graph_name: str = "graph") -> list[Finding]:
    """OSC006 when the graph takes an opaque and the member reads Dynamo makes
    are not recorded on this torch (no fix row records them): OSC004 would find
    nothing there whether or not the graph bakes a value, and says so."""
    reason = RECORDER.unobserved("member_reads")
    first = next(iter(_opaque_inputs(named)), None)
    if reason is None or first is None:
        return []
    path, _, owner = first
    return [make("OSC006", owner, path, *messages.unobserved_reads(graph_name, path, reason), site="member_reads")]


def _receivers(code: str, member: str) -> list[str]:
    """The expressions ``code`` reads ``member`` from (``t._group`` in
    ``t._group.size()``, ``t._mesh["tp"]``), where the line spells them as
    names with attributes and subscripts."""
    found = re.finditer(rf"(?<![\w.\])])({_NAME})\s*\.\s*{re.escape(member)}\b", code)
    return list(dict.fromkeys(re.sub(r"\s*\.\s*", ".", m[1]) for m in found))


def _receiver(code: str, member: str, path: str | None) -> str | None:
    """How ``code`` names the opaque whose ``member`` it reads: the input path
    itself where the line spells it, else the line's only candidate."""
    candidates = _receivers(code, member)
    if path is not None and path in candidates:
        return path
    return candidates[0] if len(candidates) == 1 and _uses(code, member) == 1 else None


def _uses(code: str, member: str) -> int:
    """How many times ``code`` reads ``member`` of something."""
    return len(re.findall(rf"\.\s*{re.escape(member)}\b", code))


_GETATTRIBUTE = re.compile(r"object\.__getattribute__\(([^,()]+), '(\w+)'\)")


def _input_path(source: str) -> str:
    """Dynamo's name of a source as the program spells it: ``t._mesh._pg_registry``
    for ``object.__getattribute__(L['t']._mesh, '_pg_registry')`` (torch 2.11, 2.12)."""
    path = graph_input_name(source)
    while True:
        plain = _GETATTRIBUTE.sub(r"\1.\2", path)
        if plain == path:
            return path
        path = plain


# ------------------------------------------------------------------ kind (b): reads below Dynamo

# Per opaque type: its C methods (the function objects a profiler's "c_call"
# names) and the code objects of its Python methods and properties, by name.
_MEMBERS: weakref.WeakKeyDictionary[type, tuple[dict[object, str], dict[types.CodeType, str]]] = (
    weakref.WeakKeyDictionary()
)
_MEMBERS_LOCK = threading.Lock()

#: FakeScriptObject's own attributes (not members of the object it stands for).
_WRAPPER_ATTRIBUTES = frozenset({"real_obj", "wrapped_obj", "script_class_name"})


def _members_of(cls: type) -> tuple[dict[object, str], dict[types.CodeType, str]]:
    with _MEMBERS_LOCK:
        found = _MEMBERS.get(cls)
        if found is not None:
            return found
    c_functions: dict[object, str] = {}
    codes: dict[types.CodeType, str] = {}
    for name in dir(cls):
        if name.startswith("__"):
            continue
        try:
            static = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        if isinstance(static, (staticmethod, classmethod)):
            continue
        function = static.fget if isinstance(static, property) else getattr(static, "__func__", static)
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType):
            codes[code] = name
        elif isinstance(function, types.BuiltinFunctionType):  # a pybind11 method's C function
            c_functions[function] = name
    with _MEMBERS_LOCK:
        _MEMBERS[cls] = (c_functions, codes)
    return c_functions, codes


def _fake_getattribute_code() -> types.CodeType | None:
    """The code of ``FakeScriptObject.__getattribute__`` as installed: torch's
    function, or the library's replacement (a plain function; its frames count
    as torch's, see ``_PATCH_DIRS``); for a callable object another package put
    there, the function it holds (among its attributes)."""
    try:
        from torch._library.fake_class_registry import FakeScriptObject
    except ImportError:  # pragma: no cover - every supported torch has it
        return None
    found: object = FakeScriptObject.__dict__.get("__getattribute__")
    for _ in range(4):  # a replacement of a replacement at most, in practice
        code = getattr(found, "__code__", None)
        if isinstance(code, types.CodeType):
            return code
        held = [getattr(found, n, None) for n in getattr(type(found), "__slots__", ())]
        held += [*getattr(found, "__dict__", {}).values(), getattr(found, "__wrapped__", None)]
        found = next((f for f in held if callable(f)), None)
        if found is None:
            return None
    return None


#: The library's replacements of torch functions (its fixes, the 2.11 backport): frames there stand for torch's.
_PATCH_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.abspath(opaque_subclass.__file__)), folder) + os.sep
    for folder in ("fixes", "backport")
)


def _outside_torch(frame: types.FrameType | None) -> types.FrameType | None:
    """``frame`` or the first frame out of it that is neither torch's nor one
    of the library's replacements of torch functions."""
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith((_TORCH_DIR, *_PATCH_DIRS)):
        frame = frame.f_back
    return frame


def _resolve(frame: types.FrameType, receiver: str) -> object | None:
    """The object ``receiver`` (a dotted name) names in ``frame``, read without
    running user code (static attribute lookup); ``None`` for a subscript."""
    if "[" in receiver:
        return None
    first, *rest = receiver.split(".")
    obj: object
    if first in frame.f_locals:
        obj = frame.f_locals[first]
    elif first in frame.f_globals:
        obj = frame.f_globals[first]
    else:
        return None
    for part in rest:
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            return None
    return obj


class ReadWatcher:
    """While active (``with watcher:``), watches this thread for members of
    ``named``'s reference opaques (and of any object of their types) used on
    the real object from code outside torch; :attr:`reads` holds what it saw,
    one per member and source line. It also records the functional
    collectives issued below Dynamo on a group named by a string
    (:attr:`collectives`, OSC005: DTensor's redistributions). A no-op while
    another profiler is set (:attr:`watching` says whether it ran)."""

    def __init__(self, named: Sequence[tuple[str, Any]]) -> None:
        self.reads: list[BakedRead] = []
        self.collectives: list[BakedGroup] = []
        self._collective_keys: set[tuple[str, str, str]] = set()  # (op, group, origin) of each kept
        self._packet_call = packet_call_code()
        self.watching = False
        self._paths: dict[int, tuple[str, str | None]] = {}
        self._objects: list[object] = []  # kept alive while watched, so that ids stay theirs
        self._types: dict[type, bool] = {}
        self._c_functions: dict[object, tuple[type, str]] = {}
        self._codes: dict[types.CodeType, tuple[type, str]] = {}
        for path, obj, owner in _opaque_inputs(named):
            self._paths.setdefault(id(obj), (path, owner))
            self._objects.append(obj)
            cls = type(obj)
            if cls in self._types:
                continue
            self._types[cls] = _guard_of(cls)
            c_functions, codes = _members_of(cls)
            self._c_functions.update((f, (cls, n)) for f, n in c_functions.items())
            self._codes.update((c, (cls, n)) for c, n in codes.items())
        self._fake_getattribute = _fake_getattribute_code()
        self._seen: set[tuple[type, str, str, int]] = set()

    def __enter__(self) -> ReadWatcher:
        if sys.getprofile() is not None:
            _log.info("%s", messages.PROFILER_ACTIVE)
            return self
        sys.setprofile(self._make_profile())
        self.watching = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.watching:
            sys.setprofile(None)
            self.watching = False
        self._objects.clear()

    def _make_profile(self) -> Callable[[types.FrameType, str, Any], None]:
        """The profile function: called on every call of this thread while
        watching, so it does the least it can (one membership test) until a hit."""
        c_functions, codes, wrapper_code = self._c_functions, self._codes, self._fake_getattribute
        hit, packet_call, collective = self._hit, self._packet_call, self._collective

        def profile(frame: types.FrameType, event: str, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                if code in codes or code is wrapper_code:
                    hit(frame, None)
                elif code is packet_call:
                    collective(frame)
            elif event == "c_call" and arg in c_functions:
                hit(frame, arg)

        return profile

    def _collective(self, frame: types.FrameType) -> None:
        """A call of an op packet: kept when it is a functional collective on a
        group named by a string, issued below Dynamo (once per op, group and line)."""
        try:
            found = collective_below(frame)
            if found is not None and (key := (found.op, found.group_name, found.origin)) not in self._collective_keys:
                self._collective_keys.add(key)
                self.collectives.append(found)
        except Exception as error:  # a profiler that raises is removed by Python: never raise
            _log.debug("compile_passes: collective watcher: %s", error)

    def _hit(self, frame: types.FrameType, c_function: object) -> None:
        """A call of a watched member: a C method (``c_function``, called from
        ``frame``), a Python method or property (``frame`` is its own), or torch's
        fake wrapper's attribute lookup."""
        try:
            if c_function is not None:
                cls, member = self._c_functions[c_function]
                self._seen_at(frame, cls, member, None, True)
                return
            caller = frame.f_back
            if caller is None:
                return
            code = frame.f_code
            if code is self._fake_getattribute:
                outside = _outside_torch(caller)  # through the library's replacement of it, if any
                if outside is not None:
                    self._through_wrapper(frame, outside)
                return
            cls, member = self._codes[code]
            first = code.co_varnames[0] if code.co_argcount else None
            self._seen_at(caller, cls, member, frame.f_locals.get(first) if first else None, True)
        except Exception as error:  # a profiler that raises is removed by Python: never raise
            _log.debug("compile_passes: read watcher: %s", error)

    def _through_wrapper(self, frame: types.FrameType, caller: types.FrameType) -> None:
        """An attribute read through torch's fake wrapper of an opaque."""
        name = frame.f_locals.get("name")
        if not isinstance(name, str) or name.startswith("__") or name in _WRAPPER_ATTRIBUTES:
            return
        real = object.__getattribute__(frame.f_locals["self"], "real_obj")
        cls = type(real)
        if cls not in self._types:
            return
        try:
            static = inspect.getattr_static(real, name)
        except AttributeError:
            return
        if callable(static) or (isinstance(static, property) and hasattr(static.fget, "__code__")):
            return  # a method, seen when it is called; a Python property, seen when its getter runs
        self._seen_at(caller, cls, name, real, False)

    def _seen_at(self, caller: types.FrameType, cls: type, member: str, obj: object, call: bool) -> None:
        code = caller.f_code
        file = code.co_filename
        if os.path.abspath(file).startswith((_TORCH_DIR, *_PATCH_DIRS)) or code in self._codes:
            return  # torch's own code (or the library's in its place), or a member using another member
        line = caller.f_lineno
        key = (cls, member, file, line)
        if key in self._seen:
            return
        self._seen.add(key)
        place = _place(file, line, code.co_name)
        text = place["code"]
        candidates = _receivers(text, member)
        receiver = candidates[0] if len(candidates) == 1 and _uses(text, member) == 1 else None
        for candidate in candidates:  # the one naming this object (or one of its type, for a C method)
            named = _resolve(caller, candidate)
            if named is not None and (named is obj if obj is not None else isinstance(real_object(named), cls)):
                receiver, obj = candidate, named
                break
        real = real_object(obj) if obj is not None else None
        path, subclass = self._paths.get(id(real), (None, None)) if real is not None else (None, None)
        value: object = None
        known = False
        plain_call = call and re.search(rf"\.\s*{re.escape(member)}\s*\(\s*\)", text) is not None
        if isinstance(real, cls) and (plain_call or not call) and _use_real(cls, member):
            # torch evaluates USE_REAL members on the real object while tracing; once more here
            attribute = getattr(real, member)
            value, known = (attribute() if call else attribute), True
        guarded = self._types[cls]
        self.reads.append(
            BakedRead(
                stage="below dynamo",
                owner=cls,
                member=member,
                call=call,
                args="",
                value=value,
                known=known,
                path=path,
                receiver=receiver,
                subclass=subclass,
                **place,
                guarded=guarded,
                guard=messages.registered_guard(cls) if guarded else None,
            )
        )


# ------------------------------------------------------------------ findings


def _op_name(read: BakedRead) -> str:
    return re.sub(r"\W", "_", f"{read.owner.__name__.lower()}_{read.member.strip('_')}")


def read_fix(read: BakedRead) -> str:
    """The fix of a baked read, with the program's names: for an opaque the
    graph takes as an input, a custom op that reads the member when the graph
    runs and the expression it replaces (where the value is a number); for an
    opaque made inside the graph, making it an input; else where to read it."""
    owner, where = read.owner.__name__, messages.code_place(read.function, read.file, read.line)
    receiver = read.receiver or read.on_input
    if read.stage == "dynamo" and not read.guarded:
        return messages.read_made_inside_fix(read.receiver, owner, read.member, where)
    numeric = read.known and isinstance(read.value, (bool, int, float)) and not read.args
    if numeric and receiver is not None:
        guarded = read.on_input if read.stage == "below dynamo" else None  # where a Python number is needed
        return messages.read_through_op_fix(
            read.owner, read.member, read.call, read.value, read.expression, where, _op_name(read), receiver, guarded
        )
    if read.stage == "below dynamo":
        return messages.read_below_dynamo_fix(read.on_input or read.member, where, owner)
    return messages.read_few_values_fix(read.expression, owner)


def lint_reads(reads: Iterable[BakedRead], graph_name: str = "graph") -> list[Finding]:
    """OSC004 findings: ``error`` for a read nothing guards, ``info`` for a
    guarded read made in the compiled function (one compilation per distinct
    value). A read below Dynamo covered by its type's registered guard costs
    nothing more than that guard: no finding."""
    findings = []
    for read in reads:
        owner = read.owner.__name__
        value, aside = messages.read_value(read.value, read.known), messages.input_aside(read.path, read.receiver)
        path = read.on_input or f"{graph_name}:{owner}.{read.member}" + ("()" if read.call else "")
        if read.stage == "dynamo" and read.guarded:
            severity: Literal["error", "info"] = "info"
            message = messages.read_guarded(read.expression, aside, owner, read.origin, value, read.guard)
        elif read.stage == "dynamo":
            severity = "error"
            message = messages.read_made_inside(read.expression, owner, read.origin, value)
        elif read.guarded:
            continue
        else:
            severity = "error"
            an_input = read.path is not None
            message = messages.read_below_dynamo(
                read.expression, aside, an_input, owner, read.function, read.origin, value
            )
        site = f"{read.expression}@{read.file}:{read.line}"
        findings.append(make("OSC004", read.subclass, path, message, read_fix(read), severity=severity, site=site))
    return findings
