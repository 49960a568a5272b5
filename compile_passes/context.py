"""Lint OSC001: reference-like objects kept in a subclass's flatten *context*.

Note [Why a mesh in the context is stale]
-----------------------------------------
torch.compile treats the context ``__tensor_flatten__`` returns as a graph
constant: Dynamo guards it with ``==`` and AOTAutograd bakes it into the code
rebuilding subclass outputs. An object meaning its *identity* (a ``DeviceMesh``
and its process groups, a registered reference opaque, any object without
``__eq__``) breaks both:

* with a value ``__eq__`` (``DeviceMesh`` compares shape and ranks, not process
  groups; a spec dataclass comparing its other fields), a later call with an
  equal but different object passes the guard and runs with the *old* one:
  outputs carry the first call's mesh;
* compared by identity, the guard (a deep copy compared with ``==``) never
  passes: the library refuses the input where Dynamo meets it
  (:func:`opaque_subclass.core.flatten.check_guardable_context`); stock torch
  stops after tracing with ``AssertionError: Guard failed on the same frame it
  was created``.

The fix lists the object among the flattened attributes, a graph input guarded
by identity (an opaque attribute). This module finds such objects at any depth:
in the context, inside its containers and objects (DTensor 2.11's
``DTensorSpec`` and PhysicsNeMo's ShardTensor spec hold the mesh), and in nested
subclasses, with the input check's walk
(:func:`opaque_subclass.core.context.walk_context`), so both spell paths alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator
from typing import Any

from opaque_subclass import OpaqueSubclass
from opaque_subclass.core.context import PLAIN_TYPES, attribute_name, holding_attribute, is_plain, walk_context
from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.registry import opaque_kind, opaque_type_of
from opaque_subclass.core.walk import Level, walk

from . import messages
from .findings import Finding, make

__all__ = [
    "PLAIN_TYPES",
    "ContextItem",
    "context_findings",
    "lint_contexts",
    "reference_reason",
    "subclass_levels",
]


@functools.cache
def _distributed_types() -> tuple[tuple[type, str], ...]:
    found: list[tuple[type, str]] = []
    try:
        from torch.distributed.device_mesh import DeviceMesh

        found.append((DeviceMesh, messages.DEVICE_MESH))
    except ImportError:  # pragma: no cover - a torch built without distributed
        pass
    try:
        from torch.distributed import ProcessGroup

        found.append((ProcessGroup, messages.PROCESS_GROUP))
    except ImportError:  # pragma: no cover - a torch built without distributed
        pass
    return tuple(found)


def reference_reason(obj: object) -> str | None:
    """Why ``obj`` means *this* object rather than a value (``None`` if it is a
    value): a registered reference opaque, a ``DeviceMesh`` / ``ProcessGroup``,
    or an object compared by identity."""
    if is_plain(obj):
        return None
    kind = opaque_kind(obj)
    if kind == "value":
        return None
    for cls, why in _distributed_types():
        if isinstance(obj, cls):
            return why
    if kind == "reference":
        return messages.REFERENCE_OPAQUE
    if isinstance(obj, (tuple, list, dict, set, frozenset)):
        return None
    if type(obj).__eq__ is object.__eq__:
        return messages.BY_IDENTITY
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class ContextItem:
    """A reference-like object found in a flatten context; ``holder`` is the innermost object with
    its own ``__eq__`` containing it (whose ``==`` decides the guard), or ``None`` in plain containers."""

    path: str
    obj: object
    reason: str
    holder: object | None


def _scan(ctx: object) -> Iterator[ContextItem]:
    """The reference-like objects in ``ctx``; the walk does not look inside them."""
    for part in walk_context(ctx, descend=lambda obj: reference_reason(obj) is None):
        why = reference_reason(part.obj)
        if why is not None:
            yield ContextItem(part.path, part.obj, why, part.holder)


def subclass_levels(value: object, name: str) -> Iterator[tuple[str, object, Any]]:
    """``(path, instance, context)`` for ``value`` and every subclass nested in
    it, outermost first, from the library's flatten walk (``path`` is the
    instance's path). Nothing for a value that is not a traceable subclass."""
    for path, slot in walk(value, name):
        if isinstance(slot, Level):
            yield path, slot.owner, slot.ctx


#: Attribute names a fix proposes for an object the instance does not hold as an attribute.
def _holder_name(owner: object, obj: object) -> str:
    """The instance attribute holding ``obj`` (by identity), or a name to give it."""
    return holding_attribute(owner, obj) or attribute_name(opaque_type_of(obj).__name__)


def _listed_names(owner: object) -> list[str] | None:
    """What ``owner.__tensor_flatten__()`` lists, or ``None``."""
    try:
        names = owner.__tensor_flatten__()[0]  # type: ignore[attr-defined]  # a subclass instance
    except Exception:  # an error message must never fail on what it reports about
        return None
    return [str(n) for n in names] if isinstance(names, (list, tuple)) else None


def _fix(cls: type, item: ContextItem, attr: str | None, owner: object) -> str:
    obj_type = opaque_type_of(item.obj)
    register = messages.register_first(obj_type) if opaque_kind(item.obj) is None else ""
    holder = _holder_name(owner, item.obj)
    if isinstance(cls, type) and issubclass(cls, OpaqueSubclass) and attr is not None:
        if item.path.count("[") == 1 and item.path.endswith("]"):  # the metadata attribute itself
            return messages.declare_opaque_attr(cls, attr, obj_type, register)
        return messages.take_out_of_meta(cls, attr, holder, obj_type, register)
    listed = _listed_names(owner)
    names = [*listed, holder] if listed is not None and holder not in listed else (listed or ["_data", holder])
    return messages.list_among_attributes(cls, holder, names, item.path, obj_type, register)


def _meta_attr(cls: type, suffix: str) -> str | None:
    """For an OpaqueSubclass, the meta attribute a context path starts with."""
    if not (isinstance(cls, type) and issubclass(cls, OpaqueSubclass)) or not suffix.startswith("["):
        return None
    try:
        index = int(suffix[1 : suffix.index("]")])
    except ValueError:
        return None
    metas = cls.meta_attrs
    return metas[index] if 0 <= index < len(metas) else None


def lint_contexts(value: object, name: str) -> list[Finding]:
    """OSC001 findings for ``value`` (a subclass instance, at any nesting depth)."""
    return context_findings(subclass_levels(value, name))


def context_findings(levels: Iterable[tuple[str, object, Any]]) -> list[Finding]:
    """OSC001 findings for ``(path, instance, context)`` triples (:func:`subclass_levels`);
    each fix is written with the instance's own attribute names."""
    findings = []
    for path, owner, ctx in levels:
        cls = type(owner)
        for item in _scan(ctx):
            where = f"{path}.<context>{item.path}"
            message = messages.context_holds(path, cls, item.obj, item.reason, item.holder)
            fix = _fix(cls, item, _meta_attr(cls, item.path), owner)
            findings.append(make("OSC001", qualified_name(cls), where, message, fix))
    return findings
