"""Routing opaques past torch 2.11 helpers that walk inner *tensors*.

Many torch 2.11 helpers walk the names returned by ``__tensor_flatten__`` and
treat every attribute as a tensor (``is_fun``, ``sync_functional_tensor``, the
meta describer, the shape-guard builder, FSDP's state sync, ...). For them an
opaque attribute is irrelevant: it has no storage, no shape and no functional
wrapper. The patches route opaques themselves, never by changing the objects
torch walks:

* :func:`tensor_attrs` and :func:`tensor_leaves` give the tensor part of a
  subclass (one ``__tensor_flatten__`` call per level), so a patch can compute
  what the helper computes over tensors only;
* :func:`skip_opaque_leaves` wraps a helper that recurses through its own
  module-level name: the recursion reaches the replacement, which answers for
  an opaque leaf with a neutral value instead of descending into it;
* :func:`hide_in_fake_args` presents tensor-only flatten results for *fake*
  subclass instances, which torch builds privately for one compilation in the
  compiling thread; a user's tensor (real, or shared between threads) is never
  touched (see Note [No writes to user objects]).

Every non-tensor attribute found here is validated: an object that is not a
registered reference opaque raises the core's error (subclass, attribute path,
type, fix) instead of being skipped.

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
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from opaque_subclass.core.flatten import _bad_attribute, check_rebuild, is_wrapper_subclass
from opaque_subclass.core.registry import opaque_kind

__all__ = [
    "hide_in_fake_args",
    "is_opaque_leaf",
    "opaque_attrs",
    "skip_opaque_leaves",
    "source_name",
    "split_attrs",
    "tensor_attrs",
    "tensor_leaves",
    "validate_attrs",
]

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()
_Tensor = torch.Tensor


def is_opaque_leaf(value: object) -> bool:
    """Whether ``value`` is a reference opaque (or torch's fake wrapper of one)."""
    return not isinstance(value, _Tensor) and opaque_kind(value) == "reference"


def _split(t: _Tensor, path: str) -> tuple[list[tuple[str, _Tensor]], dict[str, Any]]:
    """``(tensor attributes, opaque attributes)`` of one level, validated."""
    names = t.__tensor_flatten__()[0]  # type: ignore[attr-defined]  # a wrapper subclass
    tensors: list[tuple[str, _Tensor]] = []
    opaques: dict[str, Any] = {}
    for name in names:
        value = getattr(t, name)
        if isinstance(value, _Tensor):
            tensors.append((name, value))
        elif opaque_kind(value) == "reference":
            opaques[name] = value
        else:
            raise _bad_attribute(t, name, f"{path}.{name}", value)
    return tensors, opaques


def split_attrs(t: object, path: str = "x") -> tuple[list[tuple[str, _Tensor]], dict[str, Any]]:
    """``([(name, inner tensor)], {name: opaque})`` of one level of a wrapper
    subclass, in flatten order, validated: every non-tensor must be a reference
    opaque (``path`` names ``t`` in the error for one that is not). ``([], {})``
    for anything else. One ``__tensor_flatten__`` call."""
    if not is_wrapper_subclass(t):
        return [], {}
    return _split(t, path)  # type: ignore[arg-type]  # a wrapper subclass is a tensor


def opaque_attrs(t: object, path: str = "x") -> dict[str, Any]:
    """The opaque attributes ``{name: object}`` of :func:`split_attrs`."""
    return split_attrs(t, path)[1]


def tensor_attrs(t: object, path: str = "x") -> list[tuple[str, _Tensor]]:
    """The tensor attributes ``[(name, inner tensor)]`` of :func:`split_attrs`."""
    return split_attrs(t, path)[0]


def source_name(source: Any) -> str:
    """How Dynamo prints a source (``L['x']``), for the paths in error messages."""
    name = getattr(source, "name", "x")
    return str(name() if callable(name) else name)


def tensor_leaves(t: _Tensor, path: str = "x") -> list[_Tensor]:
    """The innermost tensors of ``t`` (``[t]`` for a tensor that is not a
    wrapper subclass), depth first in flatten order; opaques left out."""
    if not is_wrapper_subclass(t):
        return [t]
    out: list[_Tensor] = []
    for name, inner in _split(t, path)[0]:
        out.extend(tensor_leaves(inner, f"{path}.{name}"))
    return out


def validate_attrs(t: object, path: str) -> None:
    """Check every level of a (nested) wrapper subclass: each non-tensor
    attribute must be a reference opaque; errors name ``path`` + attribute."""
    for name, inner in tensor_attrs(t, path):
        validate_attrs(inner, f"{path}.{name}")


def validate_input(t: object, path: str) -> None:
    """Everything checked where torch first meets a subclass input while
    tracing: the attributes (:func:`validate_attrs`) and, for a real (not fake)
    input, that ``__tensor_unflatten__`` rebuilds it (:func:`~opaque_subclass.core.flatten.check_rebuild`)."""
    validate_attrs(t, path)
    from torch._subclasses.fake_tensor import is_fake

    if not is_fake(t):
        check_rebuild(t, path)


def skip_opaque_leaves(original: F, *, result: Any = None) -> F:
    """Wrap a helper ``original(t, ...)`` that recurses into inner attributes by
    calling its own module-level name: called on an opaque, the wrapper returns
    ``result`` (neutral for the helper's reduction) instead of descending."""

    @functools.wraps(original)
    def wrapper(t: Any, *args: Any, **kwargs: Any) -> Any:
        if is_opaque_leaf(t):
            return result
        return original(t, *args, **kwargs)

    return wrapper  # type: ignore[return-value]  # same signature as original


def _all_fake(tensors: list[tuple[str, _Tensor]]) -> bool:
    """Whether every tensor leaf under these (already split) attributes is fake."""
    from torch._subclasses.fake_tensor import FakeTensor

    return all(isinstance(leaf, FakeTensor) for _, inner in tensors for leaf in tensor_leaves(inner))


def _fake_subclasses_with_opaques(obj: object, out: list[_Tensor]) -> list[_Tensor]:
    if isinstance(obj, (list, tuple)):
        for o in obj:
            _fake_subclasses_with_opaques(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _fake_subclasses_with_opaques(o, out)
    elif is_wrapper_subclass(obj):
        assert isinstance(obj, _Tensor)  # for type checkers: implied by is_wrapper_subclass
        tensors, opaques = _split(obj, "x")
        if opaques and _all_fake(tensors):
            out.append(obj)
        for _, inner in tensors:
            _fake_subclasses_with_opaques(inner, out)
    return out


@contextlib.contextmanager
def _tensor_only_flatten(t: _Tensor) -> Iterator[None]:
    """While active, ``t.__tensor_flatten__()`` of this compile-private fake
    instance lists only tensor attributes. Re-entrant; restores it exactly."""
    names, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]  # a wrapper subclass
    opaques = _split(t, "x")[1]
    tensor_names = [n for n in names if n not in opaques]
    state = t.__dict__
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
    """Wrap ``original`` so that every *fake* subclass instance reachable from
    its arguments shows only tensor attributes while it runs. Fake instances
    are built by torch for one compilation and used by the compiling thread
    only; real tensors reaching ``original`` are passed as they are."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        found = _fake_subclasses_with_opaques([args, kwargs], [])
        if not found:
            return original(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for t in found:
                stack.enter_context(_tensor_only_flatten(t))
            return original(*args, **kwargs)

    return wrapper  # type: ignore[return-value]  # same signature as original
