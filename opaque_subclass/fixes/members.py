"""Members of opaques in compiled code: every baked value guarded, every
undeclared member a named error (torch 2.11 - 2.15).

A registered opaque declares ``members`` (``USE_REAL``: evaluated on the real
object while tracing, compiled in as a constant; ``INLINED``: traced). On every
release with members, torch:

* bakes a ``USE_REAL`` **method** result with no guard: ``ProcessGroup``
  (2.12+) declares ``size``, ``rank``... so, and ``t._g.size()`` compiled for a
  group of 4 returns 4 for a group of 2 (attributes and properties have a
  source and Dynamo guards them);
* fails on an **undeclared** member with ``Unsupported: Attempted to access
  unregistered member on an OpaqueObject`` (2.11: an internal Dynamo error),
  naming neither the user's line nor a working fix.

The replacements run torch's method unchanged, check before it and guard after
it (a lambda guard calling the member again: ``L['t']._g.size() == 4``, also
the recompile reason); each guard closes over its own name, arguments and
value, writing nothing onto torch's or the user's objects.

Not guarded, by design: calls with an opaque argument (``pg == other``: identity
guards and the type's ``guard`` cover it), ``__setattr__``, and members of a
sourceless opaque made in the graph by an ``INLINED`` member (derived from a
guarded object). On torch 2.11 an opaque read from a subclass computed in the
compiled function (``y = x * 2; y._mesh``) has no source and no guarded
origin: using any declared member of it is an error
(:func:`check_subclass_made_opaque`).

Each ``USE_REAL`` value read while tracing, guarded or not, is recorded as a
:class:`MemberRead` of the compilation in
:data:`~opaque_subclass.core.recorder.RECORDER`; :func:`take_member_reads`
hands them to a backend (``compile_passes``: lint OSC004). Recording changes
nothing in what Dynamo traces or guards.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opaque_subclass.core.checks import source_name
from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.core.registry import Member, is_opaque, opaque_kind, real_object
from opaque_subclass.fixes import messages
from opaque_subclass.fixes.messages import TORCH_SENTENCE as TORCH_SENTENCE
from opaque_subclass.fixes.messages import undeclared_member_error as undeclared_member_error
from opaque_subclass.patching import composes

__all__ = [
    "MemberRead",
    "check_subclass_made_opaque",
    "make_call_method",
    "make_getattr",
    "member_guard_text",
    "note_subclass_made_opaque",
    "take_member_reads",
]


@dataclass(frozen=True, slots=True)
class MemberRead:
    """A ``USE_REAL`` member evaluated while Dynamo traced, its value compiled in.

    Attributes
    ----------
    owner
        The opaque's class.
    member
        The member's name.
    call
        Whether it was called (a method) or read (an attribute, a property).
    args, kwargs
        The call's arguments (constants); keyword arguments as ``(name, value)`` pairs.
    value
        The value compiled in (``None`` with ``known=False`` if not a constant).
    known
        Whether ``value`` is the value compiled in.
    path
        Dynamo's name of the opaque (``L['t']._group``); ``None`` if sourceless.
    guarded
        Whether a guard compares the value on every call.
    frames
        ``(file, line, function)`` of the traced frames, innermost first.
    """

    owner: type
    member: str
    call: bool
    args: tuple[object, ...]
    kwargs: tuple[tuple[str, object], ...]
    value: object
    known: bool
    path: str | None
    guarded: bool
    frames: tuple[tuple[str, int, str], ...]


def _traced_frames(tx: Any) -> tuple[tuple[str, int, str], ...]:
    """``(file, line, function)`` of ``tx`` and the frames that inlined it."""
    frames = []
    while tx is not None:
        code, lineno = getattr(tx, "f_code", None), getattr(tx, "lineno", None)
        if code is not None and isinstance(lineno, int):
            frames.append((code.co_filename, lineno, code.co_name))
        tx = getattr(tx, "parent", None)
    return tuple(frames)


def _record(read: MemberRead) -> None:
    context = RECORDER.compilation()
    if context is not None:  # else traced outside a compilation (torch's own tests of Dynamo pieces)
        RECORDER.add("member_reads", context, read)


def take_member_reads(context: object | None = None) -> list[MemberRead]:
    """Take the member values recorded for ``context`` (default: this thread's
    compilation), in tracing order; the next graph gets only its own."""
    return list(RECORDER.take("member_reads", context))


def _member_type(cls: type, name: str) -> Member | None:
    from torch._library.opaque_object import get_member_type

    member: Member | None = get_member_type(cls, name)
    return member


def user_line(tx: Any) -> str:
    """Where in the user's source the traced instruction is (Dynamo's frame)."""
    code = getattr(tx, "f_code", None)
    lineno = getattr(tx, "lineno", None)
    if code is None or not isinstance(lineno, int):
        return "in the compiled function"
    text = linecache.getline(code.co_filename, lineno).strip()
    return f'File "{code.co_filename}", line {lineno}' + (f": {text}" if text else "")


def _real(variable: Any) -> object | None:
    """The real object behind a Dynamo variable of an opaque (fake wrapper or not)."""
    value = getattr(variable, "value", None)
    return None if value is None else real_object(value)


def check_declared(variable: Any, tx: Any, name: str) -> None:
    """Raise when compiled code uses an existing but undeclared member of a reference opaque."""
    if name.startswith("__"):
        return  # protocols (__bool__, __eq__, ...) are torch's own handling
    obj = _real(variable)
    if obj is None or opaque_kind(obj) != "reference" or _member_type(type(obj), name) is not None:
        return
    if not hasattr(obj, name):
        return
    path = source_name(variable.source) if variable.source is not None else None
    method = callable(getattr(obj, name))
    raise messages.undeclared_member(type(obj), name, path, user_line(tx), method)


def note_subclass_made_opaque(node: object, attr: str) -> None:
    """Remember that graph node ``node`` reads opaque attribute ``attr`` of a
    subclass computed inside the compiled function (torch 2.11, the backport's
    ``TensorVariable.dynamic_getattr``; nothing records it on 2.12+)."""
    RECORDER.put("subclass_made_opaques", node, "attr", attr)


def check_subclass_made_opaque(variable: Any, tx: Any, name: str) -> None:
    """Raise when compiled code uses a declared member of an opaque read from a
    subclass computed in the compiled function (torch 2.11): it has no source,
    so ``USE_REAL`` would be unguarded (as on 2.12 - 2.15) and ``INLINED`` fails
    in AOTAutograd on torch's fake wrapper."""
    if name.startswith("__") and name != "__getitem__":
        return
    proxy = getattr(variable, "proxy", None)
    node = getattr(proxy, "node", None)
    if node is None or variable.source is not None:
        return
    try:
        attr = RECORDER.lookup("subclass_made_opaques", node, "attr")
    except TypeError:  # not weak-referenceable: not ours
        return
    obj = _real(variable)
    if attr is None or obj is None:
        return
    member = _member_type(type(obj), name)
    if member is None:
        return  # undeclared: check_declared's error
    raise messages.subclass_made_opaque(type(obj), name, member, attr, user_line(tx))


def member_guard_text(path: str, name: str, args: Iterable[object], kwargs: Mapping[str, object], value: object) -> str:
    """How a member guard reads (and how Dynamo reports it when it fails)."""
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{path}.{name}({', '.join(shown)}) == {value!r}"


def _install_member_guard(
    variable: Any, name: str, args: tuple[object, ...], kwargs: dict[str, object], value: object
) -> None:
    from torch._dynamo.guards import install_guard

    text = member_guard_text(source_name(variable.source), name, args, kwargs, value)

    def OPAQUE_MEMBER_MATCH(builder: Any, guard: Any) -> None:  # torch's guard names are upper case
        def check(obj: object) -> bool:
            try:
                return bool(getattr(real_object(obj), name)(*args, **kwargs) == value)
            except Exception:  # a member that fails now cannot give the baked value
                return False

        builder.get_guard_manager(guard).add_lambda_guard(check, [text], guard.user_stack)

    install_guard(variable.source.make_guard(OPAQUE_MEMBER_MATCH))


@composes
def make_call_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.script_object.TorchScriptObjectVariable.call_method``
    (torch 2.11, 2.12 and 2.13) and
    ``torch._dynamo.variables.script_object.CustomClassObjectVariable.call_method``
    (its name on torch 2.14 and 2.15): each release's own fingerprint. torch
    2.12 made opaque attributes graph inputs (pytorch/pytorch#176457); no
    release up to 2.15 guards what is read from them.

    Without it, a ``USE_REAL`` method result is compiled in unguarded
    (``t._g.size()`` compiled for a group of 4 returns 4 for a group of 2) and
    an undeclared method fails inside Dynamo. With it, the result is guarded
    (``L['t']._g.size() == 4``) and recorded as a :class:`MemberRead`, and an
    undeclared method is ``OpaqueMemberError`` naming class, member, line and
    fix (on 2.11 also :func:`check_subclass_made_opaque`).
    """

    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        check_declared(self, tx, name)
        check_subclass_made_opaque(self, tx, name)
        result = original(self, tx, name, args, kwargs)
        obj = _real(self)
        if obj is None or name == "__setattr__" or _member_type(type(obj), name) != Member.USE_REAL:
            return result
        if self.source is None:
            _record_sourceless_call(obj, name, args, kwargs, result, tx)
            return result
        args_const = tuple(a.as_python_constant() for a in args)
        kwargs_const = {k: v.as_python_constant() for k, v in kwargs.items()}
        if any(is_opaque(a) for a in (*args_const, *kwargs_const.values())):
            return result
        try:
            value = result.as_python_constant()
        except NotImplementedError:
            value = getattr(obj, name)(*args_const, **kwargs_const)
        _install_member_guard(self, name, args_const, kwargs_const, value)
        if not name.startswith("__"):
            read = MemberRead(
                owner=type(obj),
                member=name,
                call=True,
                args=args_const,
                kwargs=tuple(kwargs_const.items()),
                value=value,
                known=True,
                path=source_name(self.source),
                guarded=True,
                frames=_traced_frames(tx),
            )
            _record(read)
        return result

    return call_method


def _constant(variable: Any) -> tuple[object, bool]:
    """``(value, True)`` for a Dynamo variable that is a Python constant, else ``(None, False)``."""
    try:
        return variable.as_python_constant(), True
    except Exception:  # not a constant (a tensor, a method): nothing to record
        return None, False


def _is_plain(value: object) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _peeked(variable: Any) -> tuple[object, bool]:
    """As :func:`_constant`, but an unrealized lazy variable is peeked at (realizing
    it would change torch's placeholder order) and kept only if plain."""
    from torch._dynamo.variables.lazy import LazyVariableTracker

    if isinstance(variable, LazyVariableTracker) and not variable.is_realized():
        value = variable.peek_value()
        return (value, True) if _is_plain(value) else (None, False)
    return _constant(variable)


def _record_sourceless_call(obj: object, name: str, args: Any, kwargs: Any, result: Any, tx: Any) -> None:
    """Record a ``USE_REAL`` call on a sourceless opaque, from Dynamo's constants only."""
    if name.startswith("__"):
        return
    consts = [_constant(a) for a in args]
    named = [(k, *_constant(v)) for k, v in kwargs.items()]
    if not all(ok for _, ok in consts) or not all(ok for _, _, ok in named):
        return
    if any(is_opaque(v) for v, _ in consts) or any(is_opaque(v) for _, v, _ in named):
        return
    value, known = _constant(result)
    read = MemberRead(
        owner=type(obj),
        member=name,
        call=True,
        args=tuple(v for v, _ in consts),
        kwargs=tuple((k, v) for k, v, _ in named),
        value=value,
        known=known,
        path=None,
        guarded=False,
        frames=_traced_frames(tx),
    )
    _record(read)


def _record_attribute(variable: Any, tx: Any, name: str, result: Any) -> None:
    """Record a ``USE_REAL`` attribute or property read (Dynamo guards it if sourced)."""
    obj = _real(variable)
    if obj is None or name.startswith("__") or _member_type(type(obj), name) != Member.USE_REAL:
        return
    value, known = _peeked(result)
    if not known or callable(value):  # a method looked up for a call: call_method records it
        return
    source = variable.source
    read = MemberRead(
        owner=type(obj),
        member=name,
        call=False,
        args=(),
        kwargs=(),
        value=value,
        known=True,
        path=source_name(source) if source is not None else None,
        guarded=source is not None,
        frames=_traced_frames(tx),
    )
    _record(read)


@composes
def make_getattr(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr``
    (torch 2.11, 2.12 and 2.13) and
    ``torch._dynamo.variables.script_object.CustomClassObjectVariable.tp_getattro_impl``
    (its name on torch 2.14 and 2.15): each release's own fingerprint. The
    same on every release since torch 2.12 made opaque attributes graph
    inputs (pytorch/pytorch#176457).

    Without it, reading an undeclared member (``t._h.scale``,
    ``t.mesh.get_coordinate`` on 2.11) fails with torch's ``Attempted to access
    unregistered member on an OpaqueObject`` (2.11: ``InternalTorchDynamoError``)
    and a hint at torch's private registration. With it, ``OpaqueMemberError``
    names class, member, path (``L['t']._h.scale``), line and a working fix;
    declared members reach torch unchanged, ``USE_REAL`` values recorded as
    :class:`MemberRead`.
    """

    def getattr_(self: Any, tx: Any, name: str) -> Any:
        check_declared(self, tx, name)
        result = original(self, tx, name)
        _record_attribute(self, tx, name, result)
        return result

    return getattr_


#: The class Dynamo wraps opaque objects in: its name until torch 2.13, and from 2.14.
SCRIPT_OBJECT_VARIABLE = "torch._dynamo.variables.script_object.TorchScriptObjectVariable"
CUSTOM_CLASS_VARIABLE = "torch._dynamo.variables.script_object.CustomClassObjectVariable"
