"""Paths into a flatten context, and the placeholder an adopted opaque leaves there.

A path names one object inside the context a ``__tensor_flatten__`` returns,
in the notation of :func:`opaque_subclass.core.context.children` (and of lint
OSC001's finding paths after ``<context>``): ``.mesh`` (an attribute or a
dataclass field), ``[0]`` (a sequence item), ``['spec']`` (a mapping item),
chained: ``['spec'].mesh``. A leading attribute may omit its dot (``mesh``).

Reading follows the path; writing never touches the context: every object on
the path is copied (``copy.copy``; a tuple rebuilt), the copy's attribute set
with the object's own ``__setattr__`` (so a spec that caches its hash resets
it), falling back to ``object.__setattr__`` for a frozen dataclass.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
from typing import Any

__all__ = ["ContextPath", "PathStep", "Placeholder", "parse_path"]

# One step: ".name" | "[<python literal>]"
_STEP = re.compile(r"\.(?P<attr>[A-Za-z_]\w*)|\[(?P<item>[^\]]+)\]")


@dataclasses.dataclass(frozen=True, slots=True)
class PathStep:
    """One step of a path: an attribute (``kind == "attr"``) or an item."""

    kind: str  # "attr" | "item"
    key: Any

    def text(self) -> str:
        return f".{self.key}" if self.kind == "attr" else f"[{self.key!r}]"


@dataclasses.dataclass(frozen=True, slots=True)
class ContextPath:
    """A parsed path: its steps, and the text it was written as (normalised)."""

    steps: tuple[PathStep, ...]

    @property
    def text(self) -> str:
        return "".join(step.text() for step in self.steps)

    def read(self, ctx: object) -> tuple[object, int]:
        """``(value, steps followed)``: the object at the path, or, when a step
        cannot be followed, the object where it stopped and that step's index."""
        obj = ctx
        for i, step in enumerate(self.steps):
            found, value = _step_into(obj, step)
            if not found:
                return obj, i
            obj = value
        return obj, len(self.steps)

    def replaced(self, ctx: object, value: object) -> object:
        """A copy of ``ctx`` with ``value`` at the path; ``ctx`` is left as it is.
        The path must lead to an object (see :meth:`read`)."""
        return _replaced(ctx, self.steps, value)


def parse_path(text: object) -> ContextPath | None:
    """The path ``text`` spells, or ``None`` when it is not a path."""
    if not isinstance(text, str) or not text:
        return None
    source = text if text.startswith((".", "[")) else "." + text
    steps: list[PathStep] = []
    pos = 0
    while pos < len(source):
        m = _STEP.match(source, pos)
        if m is None:
            return None
        if m["attr"] is not None:
            steps.append(PathStep("attr", m["attr"]))
        else:
            try:
                key = ast.literal_eval(m["item"])
            except (ValueError, SyntaxError):
                return None
            if not isinstance(key, (int, str)) or isinstance(key, bool):
                return None
            steps.append(PathStep("item", key))
        pos = m.end()
    return ContextPath(tuple(steps))


def _step_into(obj: object, step: PathStep) -> tuple[bool, object]:
    if step.kind == "attr":
        if isinstance(obj, (tuple, list, dict)):
            return False, None
        try:
            return True, getattr(obj, step.key)
        except AttributeError:
            return False, None
    try:
        if isinstance(obj, dict) or (isinstance(obj, (tuple, list)) and isinstance(step.key, int)):
            return True, obj[step.key]
    except (KeyError, IndexError):
        pass
    return False, None


def _replaced(obj: Any, steps: tuple[PathStep, ...], value: object) -> object:
    if not steps:
        return value
    step, rest = steps[0], steps[1:]
    if step.kind == "item":
        inner = _replaced(obj[step.key], rest, value)
        if isinstance(obj, tuple):
            items = list(obj)
            items[step.key] = inner
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        new = copy.copy(obj)
        new[step.key] = inner
        return new
    inner = _replaced(getattr(obj, step.key), rest, value)
    new = copy.copy(obj)
    try:
        setattr(new, step.key, inner)
    except AttributeError:  # a frozen dataclass (FrozenInstanceError), a read-only property
        object.__setattr__(new, step.key, inner)
    return new


class Placeholder:
    """What an adopted opaque leaves in the flatten context: equal to every
    placeholder of the same attribute name (also one unpickled from a compile
    cache), copied as itself, pickled by its name, so that the context's
    guard, its deep copy and its cache hash never depend on the object."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return type(other) is Placeholder and other.name == self.name

    def __hash__(self) -> int:
        return hash(("opaque_subclass.adoption.Placeholder", self.name))

    def __copy__(self) -> Placeholder:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Placeholder:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Placeholder, (self.name,))

    def __repr__(self) -> str:
        return f"<adopted opaque {self.name!r}>"
