"""Routing opaques past torch 2.11 helpers that walk inner *tensors*.

Many torch 2.11 helpers treat every flattened attribute as a tensor (``is_fun``,
``sync_functional_tensor``, the meta describer, the shape-guard builder, FSDP's
state sync, ...); an opaque, with no storage, shape or functional wrapper, is
irrelevant to them. The patches route opaques themselves, never changing what
torch walks:

* :func:`tensor_attrs` and :func:`tensor_leaves` give a subclass's tensor part
  (one ``__tensor_flatten__`` call per level) for computing over tensors only;
* :func:`skip_opaque_leaves` wraps a helper recursing through its module-level
  name, answering a neutral value for an opaque leaf;
* :func:`tensor_attrs_decide` asks a yes/no helper of a subclass's tensor attributes only;
* :func:`hide_in_fake_args` shows tensor-only flatten results for *fake*
  instances, private to one compilation in the compiling thread; a user's
  tensor is never touched (Note [No writes to user objects]).

A non-tensor attribute that is not a registered reference opaque raises the
core's error (subclass, path, type, fix), never skipped. Whole-input checks at
torch's entry points live in :mod:`opaque_subclass.core.checks`.

Note [No writes to user objects]
--------------------------------
An earlier version shadowed ``__tensor_flatten__`` in the ``__dict__`` of the
instance being walked, user inputs and parameters included. Another thread
reading ``x.__tensor_flatten__()``, deep-copying ``x`` or converting it to a
fake tensor at that moment saw the opaque missing (measured: thousands of wrong
reads per million, and deep copies that stayed wrong). Nothing here writes to a
tensor the compilation did not create itself.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch._subclasses.fake_tensor import FakeTensor

from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.core.walk import Level, is_wrapper_subclass, read_level, tensor_leaves

__all__ = [
    "hide_in_fake_args",
    "is_opaque_leaf",
    "opaque_attrs",
    "skip_opaque_leaves",
    "split_attrs",
    "tensor_attrs",
    "tensor_attrs_decide",
    "tensor_leaves",
]

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()
_Tensor = torch.Tensor


def is_opaque_leaf(value: object) -> bool:
    """Whether ``value`` is a reference opaque (or torch's fake wrapper of one)."""
    return not isinstance(value, _Tensor) and opaque_kind(value) == "reference"


def split_attrs(t: object, path: str = "x") -> tuple[list[tuple[str, _Tensor]], dict[str, Any]]:
    """``([(name, inner tensor)], {name: opaque})`` of one wrapper-subclass level in
    flatten order, validated (one ``__tensor_flatten__`` call); else ``([], {})``."""
    if not is_wrapper_subclass(t):
        return [], {}
    level = read_level(t, path)  # type: ignore[arg-type]  # a wrapper subclass is a tensor
    return [(a.name, a.value) for a in level.tensors()], level.opaques()


def opaque_attrs(t: object, path: str = "x") -> dict[str, Any]:
    """The opaque attributes ``{name: object}`` of :func:`split_attrs`."""
    return split_attrs(t, path)[1]


def tensor_attrs(t: object, path: str = "x") -> list[tuple[str, _Tensor]]:
    """The tensor attributes ``[(name, inner tensor)]`` of :func:`split_attrs`."""
    return split_attrs(t, path)[0]


def skip_opaque_leaves(original: F, *, result: Any = None) -> F:
    """Wrap a helper ``original(t, ...)`` recursing through its module-level name:
    on an opaque, return ``result`` (neutral for its reduction) instead."""

    @functools.wraps(original)
    def wrapper(t: Any, *args: Any, **kwargs: Any) -> Any:
        if is_opaque_leaf(t):
            return result
        return original(t, *args, **kwargs)

    return wrapper  # type: ignore[return-value]  # same signature as original


def tensor_attrs_decide(
    original: Callable[[object], object],
    combine: Callable[[Iterable[bool]], bool],
    mixed: Callable[[bool, bool], BaseException],
) -> Callable[[object], bool]:
    """``original(t)``, a yes/no question torch asks of every attribute of a subclass (``is_fun``,
    ``is_fake``), asked instead of the tensor attributes of a level with opaques, through the
    returned function: they must agree (else ``mixed(any, all)``), ``combine`` gives the answer."""

    def decide(t: object) -> bool:
        tensors, opaques = split_attrs(t)
        if not opaques:
            return bool(original(t))
        flags = [decide(x) for _, x in tensors]
        if any(flags) != all(flags):
            raise mixed(any(flags), all(flags))
        return combine(flags)

    return decide


def _fake_levels_with_opaques(level: Level, out: list[Level]) -> bool:
    """Collect the levels under ``level`` (itself included) that hold opaques and
    only fake tensor leaves; returns whether all of ``level``'s tensor leaves are fake."""
    all_fake = True
    for a in level.attrs:
        if a.kind == "tensor":
            all_fake = all_fake and isinstance(a.value, FakeTensor)
        elif a.kind == "subclass":
            all_fake = _fake_levels_with_opaques(read_level(a.value, a.path), out) and all_fake
    if all_fake and any(a.kind == "opaque" for a in level.attrs):
        out.append(level)
    return all_fake


def _fake_subclasses_with_opaques(obj: object, out: list[Level]) -> list[Level]:
    if isinstance(obj, (list, tuple)):
        for o in obj:
            _fake_subclasses_with_opaques(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _fake_subclasses_with_opaques(o, out)
    elif is_wrapper_subclass(obj):
        _fake_levels_with_opaques(read_level(obj, "x"), out)  # type: ignore[arg-type]  # a wrapper subclass is a tensor
    return out


@contextlib.contextmanager
def _tensor_only_flatten(level: Level) -> Iterator[None]:
    """While active, ``__tensor_flatten__()`` of this compile-private fake
    instance lists only tensor attributes. Re-entrant; restores it exactly."""
    tensor_names = [a.name for a in level.tensors()]
    ctx = level.ctx
    state = level.owner.__dict__
    previous = state.get("__tensor_flatten__", _MISSING)
    state["__tensor_flatten__"] = lambda: (tensor_names, ctx)
    try:
        yield
    finally:
        if previous is _MISSING:
            del state["__tensor_flatten__"]
        else:
            state["__tensor_flatten__"] = previous


def hide_in_fake_args(original: F) -> F:
    """Wrap ``original`` so that *fake* subclass instances in its arguments (private
    to the compiling thread) show only tensor attributes while it runs; real
    tensors pass as they are."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        found = _fake_subclasses_with_opaques([args, kwargs], [])
        if not found:
            return original(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for level in found:
                stack.enter_context(_tensor_only_flatten(level))
            return original(*args, **kwargs)

    return wrapper  # type: ignore[return-value]  # same signature as original
