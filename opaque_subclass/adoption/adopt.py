"""Adopting a subclass you do not own: objects of its flatten context made opaque attributes.

A subclass written before torch 2.12 keeps its mesh (or process group) in its
``__tensor_flatten__`` context, where torch.compile guards it by equality and
bakes the compile-time object into the graph: a later call with an equal mesh
of other process groups runs with the first call's mesh (lint OSC001). A user
who cannot list the mesh among the class's attributes (the class is another
package's, which builds op outputs, gradients and tangents as the class
itself, so a subclass does not help) declares the change instead::

    handle = opaque_subclass.adopt(ShardTensor, {"_mesh": ContextOpaque("[0].mesh", DeviceMesh)})

While adopted, ``__tensor_flatten__`` lists ``_mesh`` after the class's own
attributes and returns the context with the mesh replaced by a
:class:`~opaque_subclass.adoption.paths.Placeholder`; ``__tensor_unflatten__``
puts the given ``_mesh`` back into a copy of the context before the class's own
unflatten runs. Only the class's methods change, so every instance is covered:

* the context compares, deep-copies and pickles the same for every mesh, so
  Dynamo's guard on it (``__metadata_guard__`` or ``==``), the guard's deep copy
  and a pickling cache key no longer depend on the mesh; the mesh is a graph
  input guarded by identity (and its registration's ``guard``);
* ``__tensor_unflatten__`` called without ``_mesh`` (the class's own code)
  rebuilds from the context when it still holds the object, and raises a named
  error when it holds the placeholder;
* ``__coerce_same_metadata_as_tangent__`` (called by torch on a runtime tangent
  with the traced context) gets that context with each placeholder replaced by
  the tangent's own object;
* ``_mesh`` is a read-only class attribute reading the instance's own context.

Instances never change; :meth:`Adoption.undo` (or :func:`unadopt`) restores the
class's methods exactly. ``__metadata_guard__`` and
``_stable_hash_for_caching`` are kept: they read the placeholder context or the
instance, never the mesh's identity.

Threads: adoptions are made and undone under one lock, replacing methods so
every flatten stays readable by the current unflatten (unflatten, which reads
both forms, first and flatten last; undo the reverse). A program compiled while
adopted holds the placeholder context and fails its guard once unadopted, but a
call still running on another thread during ``unadopt`` rebuilds outputs with
the class's own unflatten: undo an adoption while no compiled code of the class
runs.
"""

from __future__ import annotations

import dataclasses
import keyword
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from opaque_subclass.adoption import messages
from opaque_subclass.adoption.paths import ContextPath, Placeholder, parse_path
from opaque_subclass.core.context import walk_context
from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.registry import is_torch_own_opaque_type, opaque_kind, opaque_type_of, register_opaque

__all__ = ["Adoption", "ContextOpaque", "adopt", "adoptions", "unadopt"]

log = logging.getLogger(__name__)

_TENSOR_NAMES = frozenset(dir(torch.Tensor))
_FLATTEN = "__tensor_flatten__"
_UNFLATTEN = "__tensor_unflatten__"
_COERCE = "__coerce_same_metadata_as_tangent__"
_ABSENT = object()  # a name not in the class's own __dict__ before adoption


@dataclasses.dataclass(frozen=True)
class ContextOpaque:
    """Where an object to adopt sits in the flatten context, and its class.

    ``path`` uses OSC001's path notation after ``<context>``: ``.mesh`` (attribute or dataclass field),
    ``[0]`` (tuple or list item), ``['spec']`` (mapping item), chained (``[0].mesh``). ``cls`` must be a
    registered reference opaque (``DeviceMesh`` and ``ProcessGroup`` register on first use, as in torch).
    """

    path: str
    cls: type


@dataclasses.dataclass(frozen=True)
class _Slot:
    """One checked declaration of the adopted class ``owner``, with the placeholder it leaves."""

    owner: type
    name: str
    path: ContextPath
    cls: type
    placeholder: Placeholder

    def read(self, ctx: object) -> object:
        """The object (or placeholder) at the path of ``ctx``; else an error naming what is there."""
        value, depth = self.path.read(ctx)
        if depth < len(self.path.steps):
            raise messages.path_not_found(
                self.owner,
                self.name,
                self.path.text,
                ContextPath(self.path.steps[:depth]).text,
                self.path.steps[depth].text(),
                value,
                self.cls,
                _suggest(ctx, self.cls),
            )
        return value

    def check(self, ctx: object, value: object) -> None:
        """Refuse a ``value`` from the class's own context not of the declared class (a placeholder too:
        an instance built from an adopted context after the undo)."""
        if not issubclass(opaque_type_of(value), self.cls):
            raise messages.wrong_type_at_path(
                self.owner, self.name, self.path.text, value, self.cls, _suggest(ctx, self.cls)
            )


def _suggest(ctx: object, opaque_cls: type) -> str | None:
    """The path of the first object of ``opaque_cls`` in ``ctx``, for a fix."""
    try:
        for part in walk_context(ctx):
            if part.path and isinstance(part.obj, opaque_cls):
                return part.path
    except Exception:  # an error message must never crash
        return None
    return None


def _raw(cls: type, name: str) -> Any:
    """The unbound object ``name`` resolves to in ``cls``'s MRO; ``None`` when absent."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


class _AdoptedAttribute:
    """The attribute an adopted opaque is listed under: reads it from the instance's own flatten context."""

    def __init__(self, slot: _Slot, flatten: Any) -> None:
        self._slot = slot
        self._flatten = flatten

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        ctx = self._flatten.__get__(obj, type(obj))()[1]
        return self._slot.read(ctx)

    def __set__(self, obj: object, value: object) -> None:
        raise messages.set_adopted(type(obj), self._slot.name, self._slot.path.text)


def _keep_reads_out_of_dynamo() -> None:
    """Never let Dynamo compile :meth:`_AdoptedAttribute.__get__` as a frame of its own.

    When a compiled function uses an adopted opaque in its graph (``t.redistribute(t._mesh, ...)``),
    Dynamo's compiled code reads the attribute on every call to pass it as a graph input: that runs
    ``__get__`` as a Python frame inside the compiled call, which Dynamo would compile as a second
    program (whose graph holds whatever the class's flatten calls: PhysicsNeMo's
    ``__subclass_flatten_context__``), counted as a compilation and run on every call. The frame, and
    the class's flatten it calls, run as plain Python at the top level; Dynamo still inlines
    ``__get__`` when it traces code that reads the attribute (a code's run strategy is only read for
    a top-level frame)."""
    from torch._C._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import (  # type: ignore[attr-defined]  # imported there from torch._C, torch 2.11 - 2.15
        FrameAction,
        FrameExecStrategy,
    )

    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    set_code_exec_strategy(_AdoptedAttribute.__get__.__code__, skip)


@dataclasses.dataclass(frozen=True, eq=False)
class Adoption:
    """An adoption in force, returned by :func:`adopt`; :meth:`undo` (or leaving ``with``) restores the class."""

    cls: type
    opaques: Mapping[str, ContextOpaque]
    _slots: tuple[_Slot, ...] = dataclasses.field(repr=False)
    _before: dict[str, Any] = dataclasses.field(repr=False, default_factory=dict)
    _installed: dict[str, Any] = dataclasses.field(repr=False, default_factory=dict)

    @property
    def active(self) -> bool:
        """Whether the class is adopted by this adoption now."""
        with _LOCK:
            return _ADOPTIONS.get(self.cls) is self

    def undo(self) -> None:
        """Restore the class's own methods (idempotent)."""
        with _LOCK:
            if _ADOPTIONS.get(self.cls) is not self:
                return
            for name in sorted(self._installed, key=_removal_order):
                if self.cls.__dict__.get(name) is not self._installed[name]:
                    log.warning(messages.REPLACED_AFTER_ADOPTION, qualified_name(self.cls), name)
                    continue
                before = self._before[name]
                if before is _ABSENT:
                    delattr(self.cls, name)
                else:
                    setattr(self.cls, name, before)
            del _ADOPTIONS[self.cls]

    def summary(self) -> str:
        """One line for ``support().adopted``: class, methods replaced, ``_mesh <- <context>[0].mesh``."""
        methods = sorted(n for n in self._installed if n.startswith("__"))
        moved = ", ".join(f"{s.name} <- <context>{s.path.text}" for s in self._slots)
        return f"{qualified_name(self.cls)}: {', '.join(methods)} replaced; {moved}"

    def describe(self) -> str:
        shown = ", ".join(f"{n!r}: ContextOpaque({o.path!r}, {o.cls.__qualname__})" for n, o in self.opaques.items())
        return f"opaques {{{shown}}}"

    def __enter__(self) -> Adoption:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _removal_order(name: str) -> int:
    """The flatten goes first, the unflatten (which reads both forms) last."""
    return {_FLATTEN: 0, _COERCE: 1}.get(name, 3 if name == _UNFLATTEN else 2)


_ADOPTIONS: dict[type, Adoption] = {}
_LOCK = threading.RLock()


def adoptions() -> tuple[Adoption, ...]:
    """The adoptions in force, in the order they were made."""
    with _LOCK:
        return tuple(_ADOPTIONS.values())


def unadopt(cls: type) -> bool:
    """Undo the adoption of ``cls`` (see :meth:`Adoption.undo`); whether it was adopted."""
    with _LOCK:
        adoption = _ADOPTIONS.get(cls)
        if adoption is None:
            return False
        adoption.undo()
        return True


def _check_class(cls: object) -> type:
    if (
        not isinstance(cls, type)
        or not issubclass(cls, torch.Tensor)
        or _raw(cls, _FLATTEN) is None
        or _raw(cls, _UNFLATTEN) is None
    ):
        raise messages.not_a_subclass(cls)
    return cls


def _check_slot(cls: type, name: object, decl: object) -> _Slot:
    if not isinstance(decl, ContextOpaque):
        raise messages.bad_declaration(cls, name, decl)
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise messages.name_not_identifier(cls, name)
    if name in _TENSOR_NAMES:
        raise messages.name_shadows_tensor(cls, name)
    if hasattr(cls, name):
        raise messages.name_on_class(cls, name)
    opaque_cls = decl.cls
    if not isinstance(opaque_cls, type):
        raise messages.unregistered_type(cls, name, decl.path, opaque_cls, None)
    kind = opaque_kind(opaque_cls)
    if kind is None and is_torch_own_opaque_type(opaque_cls):
        register_opaque(opaque_cls)  # as torch registers it itself (see OpaqueSubclass.opaque_attrs)
        kind = opaque_kind(opaque_cls)
    if kind != "reference":
        raise messages.unregistered_type(cls, name, decl.path, opaque_cls, kind)
    path = parse_path(decl.path)
    if path is None:
        raise messages.bad_path(cls, name, decl.path, opaque_cls)
    return _Slot(cls, name, path, opaque_cls, Placeholder(name))


def _check_example(cls: type, slots: tuple[_Slot, ...], example: object) -> None:
    if not isinstance(example, cls):
        raise messages.wrong_example(cls, example)
    names, ctx = _raw(cls, _FLATTEN).__get__(example, type(example))()
    for slot in slots:
        if slot.name in names:
            raise messages.name_flattened(cls, slot.name)
        slot.check(ctx, slot.read(ctx))


def _make_flatten(slots: tuple[_Slot, ...], flatten: Any) -> Callable[..., Any]:
    names = [slot.name for slot in slots]

    def __tensor_flatten__(self: torch.Tensor) -> tuple[list[str], Any]:
        own, ctx = flatten.__get__(self, type(self))()
        for slot in slots:
            value = slot.read(ctx)
            slot.check(ctx, value)
            ctx = slot.path.replaced(ctx, slot.placeholder)
        return [*own, *names], ctx

    return __tensor_flatten__


def _make_unflatten(slots: tuple[_Slot, ...], unflatten: Any) -> classmethod[Any, Any, Any]:
    names = frozenset(slot.name for slot in slots)

    def __tensor_unflatten__(klass: type, inner: dict[str, Any], ctx: Any, outer_size: Any, outer_stride: Any) -> Any:
        for slot in slots:
            value = slot.read(ctx)
            if slot.name in inner:
                obj = inner[slot.name]
                if not issubclass(opaque_type_of(obj), slot.cls):
                    raise messages.wrong_type_in_slot(klass, slot.name, obj, slot.cls)
                ctx = slot.path.replaced(ctx, obj)
            elif isinstance(value, Placeholder):
                raise messages.missing_opaque(klass, slot.name, slot.path.text)
        own = {k: v for k, v in inner.items() if k not in names}
        return unflatten.__get__(None, klass)(own, ctx, outer_size, outer_stride)

    return classmethod(__tensor_unflatten__)


def _make_coerce(slots: tuple[_Slot, ...], coerce: Any, flatten: Any) -> Callable[..., Any]:
    def __coerce_same_metadata_as_tangent__(self: torch.Tensor, expected: Any, *rest: Any) -> Any:
        own: Any = _ABSENT
        for slot in slots:
            value, depth = slot.path.read(expected)
            if depth < len(slot.path.steps) or not isinstance(value, Placeholder):
                continue
            if own is _ABSENT:
                own = flatten.__get__(self, type(self))()[1]
            obj, depth = slot.path.read(own)
            if depth == len(slot.path.steps) and not isinstance(obj, Placeholder):
                expected = slot.path.replaced(expected, obj)
        return coerce.__get__(self, type(self))(expected, *rest)

    return __coerce_same_metadata_as_tangent__


def _is_adoption_method(fn: object) -> bool:
    fn = getattr(fn, "__func__", fn)
    return (
        getattr(fn, "__qualname__", "").startswith(("_make_flatten.", "_make_unflatten."))
        and getattr(fn, "__module__", "") == __name__
    )


def adopt(cls: type, opaques: Mapping[str, ContextOpaque], *, example: object = None) -> Adoption:
    """Make objects of ``cls``'s flatten context opaque attributes of ``cls``.

    Parameters
    ----------
    cls
        A tensor subclass you do not own whose flatten context keeps a ``DeviceMesh`` or process group.
    opaques
        ``{attribute name: ContextOpaque(path, cls)}``: the new attribute (not one of ``cls``), where the
        object sits in the context, and its registered reference opaque class.
    example
        An instance of ``cls`` to check every path on now, instead of on the first flatten.

    Returns
    -------
    Adoption
        The handle: ``.undo()`` restores the class (also ``with adopt(...):``). Adopting again with the
        same declaration returns the adoption in force; with another raises :class:`ValueError`.

    Raises
    ------
    OpaqueTypeError
        ``cls`` has no flatten protocol, a declaration is not a ``ContextOpaque`` or names no registered
        reference opaque, or ``example`` holds another type at a path.
    OpaqueValueError
        A bad attribute name or path, or ``cls`` adopted already with another declaration.
    OpaqueAttributeError
        ``example``'s context has nothing at a path.
    """
    if torch.compiler.is_compiling():
        raise messages.adopt_while_compiling(cls)
    cls = _check_class(cls)
    if not isinstance(opaques, Mapping) or not opaques:
        raise messages.bad_declaration(cls, "_mesh", opaques)
    with _LOCK:
        existing = _ADOPTIONS.get(cls)
        if existing is not None:
            if dict(existing.opaques) == dict(opaques):
                return existing
            raise messages.adopted_elsewhere(cls, existing)
        if _is_adoption_method(_raw(cls, _FLATTEN)):
            base = next(k for k in cls.__mro__ if k in _ADOPTIONS)
            raise messages.adopted_elsewhere(base, _ADOPTIONS[base])
        slots = tuple(_check_slot(cls, name, decl) for name, decl in opaques.items())
        paths = [slot.path for slot in slots]
        for slot in slots:
            if paths.count(slot.path) > 1:
                raise messages.path_shared(cls, slot.name, slot.path.text)
        if example is not None:
            _check_example(cls, slots, example)
        flatten, unflatten, coerce = _raw(cls, _FLATTEN), _raw(cls, _UNFLATTEN), _raw(cls, _COERCE)
        _keep_reads_out_of_dynamo()
        installed: dict[str, Any] = {slot.name: _AdoptedAttribute(slot, flatten) for slot in slots}
        if coerce is not None:
            installed[_COERCE] = _make_coerce(slots, coerce, flatten)
        installed[_UNFLATTEN] = _make_unflatten(slots, unflatten)
        installed[_FLATTEN] = _make_flatten(slots, flatten)
        adoption = Adoption(
            cls,
            dict(opaques),
            slots,
            {name: cls.__dict__.get(name, _ABSENT) for name in installed},
            installed,
        )
        # The attributes and the unflatten (which reads both forms) before the
        # flatten: no thread sees a flatten the unflatten cannot read.
        for name in sorted(installed, key=_removal_order, reverse=True):
            setattr(cls, name, installed[name])
        _ADOPTIONS[cls] = adoption
        log.debug("adopted %s: %s", qualified_name(cls), adoption.describe())
    return adoption
