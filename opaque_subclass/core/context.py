"""The one walk over a flatten context (what ``__tensor_flatten__`` returns second).

torch.compile treats a flatten context as a graph constant: Dynamo guards on it
with ``==`` against a deep copy, AOTAutograd bakes it into output rebuilding.
Two users look inside: the input check refusing a context unequal to its copy
(:func:`opaque_subclass.core.flatten.check_guardable_context`, via
:func:`unequal_to_copy`) and lint OSC001, reporting objects that stand for
*this* object (a mesh, a process group, a reference opaque;
``compile_passes/context.py``, via :func:`walk_context`). Both use
:func:`children`, so they agree on contents and paths (``[0]``, ``['spec']``, ``.mesh``).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "MAX_DEPTH",
    "PLAIN_TYPES",
    "ContextPart",
    "attribute_name",
    "children",
    "distributed_part",
    "holding_attribute",
    "is_plain",
    "unequal_to_copy",
    "walk_context",
]

#: How deep the walk goes into nested containers and objects.
MAX_DEPTH = 8

#: Values compared by value, and program constants (classes, functions, modules): never walked into.
PLAIN_TYPES = (
    type(None), bool, int, float, complex, str, bytes, range, slice, type(Ellipsis),
    torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size,
    enum.Enum, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
)  # fmt: skip

_CONTAINERS = (tuple, list, dict, set, frozenset)


@dataclasses.dataclass(frozen=True, slots=True)
class ContextPart:
    """One object inside a flatten context.

    ``path``: its place in the context (``""``, ``[0]``, ``['spec']``, ``.mesh``,
    ``{...}`` for a set member); ``holder``: the innermost enclosing object with
    its own ``__eq__`` (which decides a guard on it), ``None`` under plain containers.
    """

    path: str
    obj: object
    holder: object | None


def children(obj: object) -> Iterator[tuple[str, Any]]:
    """``(path suffix, value)`` of what ``obj`` holds: container items, dataclass
    fields, or the instance ``__dict__`` and ``__slots__`` of any other object."""
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield f"[{i}]", item
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield f"[{key!r}]", item
    elif isinstance(obj, (set, frozenset)):
        for item in obj:
            yield "{...}", item
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield f".{f.name}", getattr(obj, f.name, None)
    else:
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            for key, item in state.items():
                yield f".{key}", item
        for name in getattr(type(obj), "__slots__", ()):
            if isinstance(name, str) and hasattr(obj, name) and name != "__dict__":
                yield f".{name}", getattr(obj, name)


def is_plain(obj: object) -> bool:
    """Whether ``obj`` is a :data:`PLAIN_TYPES` value or a tensor: never walked into nor reported."""
    return isinstance(obj, PLAIN_TYPES) or isinstance(obj, torch.Tensor)


def _holder_of(part: ContextPart) -> object | None:
    """The holder of ``part``'s children: ``part.obj`` if it has its own ``__eq__``, else ``part.holder``."""
    obj = part.obj
    own_eq = not isinstance(obj, _CONTAINERS) and type(obj).__eq__ is not object.__eq__
    return obj if own_eq else part.holder


def walk_context(ctx: object, *, descend: Callable[[object], bool] | None = None) -> Iterator[ContextPart]:
    """Every part of ``ctx``, itself first, depth first; parts that are plain,
    already visited, :data:`MAX_DEPTH` down or refused by ``descend`` are not entered."""
    seen: set[int] = set()
    stack: list[tuple[ContextPart, int]] = [(ContextPart("", ctx, None), 0)]
    while stack:
        part, depth = stack.pop()
        yield part
        obj = part.obj
        if depth >= MAX_DEPTH or is_plain(obj) or id(obj) in seen:
            continue
        if descend is not None and not descend(obj):
            continue
        seen.add(id(obj))
        holder = _holder_of(part)
        below = [(ContextPart(part.path + suffix, child, holder), depth + 1) for suffix, child in children(obj)]
        stack.extend(reversed(below))


def _equal_to_copy(obj: object) -> bool:
    try:
        return bool(copy.deepcopy(obj) == obj)
    except Exception:  # cannot be copied or compared: not what this search looks for
        return True


def unequal_to_copy(ctx: object) -> ContextPart | None:
    """The innermost part of ``ctx`` unequal to its deep copy (where a Dynamo guard
    would fail), or ``None``. Raises what ``copy.deepcopy(ctx)`` or ``==`` raise."""
    if bool(copy.deepcopy(ctx) == ctx):
        return None
    part = ContextPart("", ctx, None)
    for _ in range(MAX_DEPTH):
        if is_plain(part.obj):
            break
        holder = _holder_of(part)
        inner = next(
            (
                ContextPart(part.path + suffix, child, holder)
                for suffix, child in children(part.obj)
                if not is_plain(child) and not _equal_to_copy(child)
            ),
            None,
        )
        if inner is None:
            break
        part = inner
    return part


def _distributed_classes() -> tuple[type, ...]:
    """torch's ``ProcessGroup`` and ``DeviceMesh``, where already imported (imports nothing)."""
    found: list[type] = []
    for module_name, class_name in (
        ("torch.distributed.distributed_c10d", "ProcessGroup"),
        ("torch.distributed.device_mesh", "DeviceMesh"),
    ):
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def distributed_part(ctx: object) -> ContextPart | None:
    """The first ``ProcessGroup`` or ``DeviceMesh`` in ``ctx`` (depth first), or
    ``None``. In a flatten context, torch.compile cannot guard a group (no
    copy), and an equal mesh of other groups passes the guard with the first
    call's mesh."""
    classes = _distributed_classes()
    if not classes:
        return None
    for part in walk_context(ctx, descend=lambda obj: not isinstance(obj, classes)):
        if isinstance(part.obj, classes):
            return part
    return None


#: The attribute names a fix gives these classes' objects when no attribute holds them.
_CONVENTIONAL_NAMES = {"DeviceMesh": "_mesh", "ProcessGroup": "_group"}


def holding_attribute(owner: object, obj: object) -> str | None:
    """The ``__dict__`` attribute of ``owner`` holding ``obj`` (by identity), or ``None``."""
    try:
        attributes = vars(owner)
    except TypeError:
        return None
    return next((name for name, value in attributes.items() if value is obj and not name.startswith("__")), None)


def attribute_name(type_name: str) -> str:
    """The attribute a fix gives an unheld ``type_name`` object: ``_mesh``,
    ``_group``, else the snake-case class name (``_my_handle``)."""
    return _CONVENTIONAL_NAMES.get(
        type_name, "_" + "".join(f"_{c.lower()}" if c.isupper() else c for c in type_name).lstrip("_")
    )
