"""Presenting tensor-only ``__tensor_flatten__`` results to torch code that
walks inner *tensors*.

Many torch 2.11 helpers walk the names returned by ``__tensor_flatten__`` and
treat every attribute as a tensor (``is_fun``, ``has_data_mutation``, the
shape-guard builder, ...). For them an opaque attribute is irrelevant: it has
no storage, no shape and no functional wrapper. :func:`tensor_only_flatten`
shadows ``__tensor_flatten__`` on the *instance* (never on the class) for the
duration of a call, so those helpers see only the tensor attributes; the
patches built with :func:`hide_in_first_arg` and :func:`hide_in_all_args` use
it. Helpers that call ``type(t).__tensor_flatten__(t)`` bypass an instance
shadow and get a replacement of their own instead.

Every non-tensor attribute found here is validated: an object that is not a
registered reference opaque raises the core's error (subclass, attribute path,
type, fix) instead of being hidden.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from ..flatten import _bad_attribute, is_wrapper_subclass
from ..registry import opaque_kind

__all__ = [
    "hide_in_all_args",
    "hide_in_first_arg",
    "opaque_attrs",
    "subclasses_with_opaques",
    "tensor_only_flatten",
    "validate_attrs",
]

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()
_Tensor = torch.Tensor


def opaque_attrs(t: object, path: str = "x") -> dict[str, Any]:
    """The opaque attributes ``{name: object}`` of a wrapper subclass (empty for
    anything else), validated: every non-tensor must be a reference opaque.
    ``path`` names ``t`` in the error for one that is not."""
    if not is_wrapper_subclass(t):
        return {}
    names = t.__tensor_flatten__()[0]  # type: ignore[attr-defined]  # a wrapper subclass
    found: dict[str, Any] = {}
    for name in names:
        value = getattr(t, name)
        if isinstance(value, _Tensor):
            continue
        if opaque_kind(value) != "reference":
            raise _bad_attribute(t, name, f"{path}.{name}", value)  # type: ignore[arg-type]  # t is a tensor
        found[name] = value
    return found


def validate_attrs(t: object, path: str) -> None:
    """Check every level of a (nested) wrapper subclass: each non-tensor
    attribute must be a reference opaque; errors name ``path`` + attribute."""
    if not is_wrapper_subclass(t):
        return
    opaque_attrs(t, path)
    for name in t.__tensor_flatten__()[0]:  # type: ignore[attr-defined]  # a wrapper subclass
        value = getattr(t, name)
        if isinstance(value, _Tensor):
            validate_attrs(value, f"{path}.{name}")


@contextlib.contextmanager
def tensor_only_flatten(t: torch.Tensor) -> Iterator[dict[str, Any]]:
    """While active, ``t.__tensor_flatten__()`` lists only tensor attributes.

    Yields the hidden opaques. Re-entrant; restores the instance exactly.
    """
    names, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]  # a wrapper subclass
    hidden = opaque_attrs(t)
    tensor_names = [n for n in names if n not in hidden]
    state = t.__dict__
    previous = state.get("__tensor_flatten__", _MISSING)
    state["__tensor_flatten__"] = lambda: (tensor_names, ctx)
    try:
        yield hidden
    finally:
        if previous is _MISSING:
            del state["__tensor_flatten__"]
        else:
            state["__tensor_flatten__"] = previous


def subclasses_with_opaques(obj: object, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every wrapper subclass with opaque attributes reachable from ``obj``
    (through lists, tuples, dicts and inner tensors), appended to ``out``."""
    if isinstance(obj, (list, tuple)):
        for o in obj:
            subclasses_with_opaques(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            subclasses_with_opaques(o, out)
    elif is_wrapper_subclass(obj):
        assert isinstance(obj, _Tensor)  # for type checkers: implied by is_wrapper_subclass
        if opaque_attrs(obj):
            out.append(obj)
        for name in obj.__tensor_flatten__()[0]:  # type: ignore[attr-defined]  # a wrapper subclass
            value = getattr(obj, name)
            if isinstance(value, _Tensor):
                subclasses_with_opaques(value, out)
    return out


def hide_in_first_arg(original: F) -> F:
    """Wrap ``original(t, ...)`` so that ``t`` and every subclass nested in it
    show only their tensor attributes while it runs."""

    @functools.wraps(original)
    def wrapper(t: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_wrapper_subclass(t):
            return original(t, *args, **kwargs)
        found = subclasses_with_opaques(t, [])
        if not found:
            return original(t, *args, **kwargs)
        with contextlib.ExitStack() as stack:
            for s in found:
                stack.enter_context(tensor_only_flatten(s))
            return original(t, *args, **kwargs)

    return wrapper  # type: ignore[return-value]  # same signature as original


def hide_in_all_args(original: F) -> F:
    """Wrap ``original`` so that every subclass reachable from its arguments
    shows only tensor attributes while it runs."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        found = subclasses_with_opaques([args, kwargs], [])
        if not found:
            return original(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for t in found:
                stack.enter_context(tensor_only_flatten(t))
            return original(*args, **kwargs)

    return wrapper  # type: ignore[return-value]  # same signature as original
