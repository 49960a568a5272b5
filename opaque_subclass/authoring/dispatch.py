"""Dispatch for :class:`~opaque_subclass.OpaqueSubclass`: the per-class op
table, and the default rule for ops without an entry.

The default rule applies the op to each inner tensor attribute in turn (every
``OpaqueSubclass`` argument of the class replaced by that attribute), then
rewraps every tensor result with the opaques and metadata of the arguments via
:meth:`OpaqueSubclass.wrap_like`. All arguments of the class must carry the
same opaque objects (by identity, seen through torch's fake wrappers) and equal
metadata; otherwise the op has no single meaning and an
:class:`~opaque_subclass.OpaqueSubclassError` says which attribute differs and
how to fix it. Results go through torch's ``return_and_correct_aliasing`` so
in-place and view ops keep plain-tensor aliasing semantics.

A ``TypeError`` raised by a rule (a registered one, or the default rule's
``wrap_like``) leaves :func:`dispatch` as an ``OpaqueSubclassError`` with the
``TypeError`` chained: torch's Python operators (``Tensor.__mul__`` and the
others) turn a ``TypeError`` from anywhere below them into ``NotImplemented``,
so ``x * 2`` would report only ``unsupported operand type(s)`` and hide the
rule's message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_unflatten

from opaque_subclass.core.errors import OpaqueSubclassError, describe_type, subject
from opaque_subclass.core.registry import real_object

__all__ = ["dispatch", "lookup"]


def lookup(cls: type, func: Any) -> Callable[..., Any] | None:
    """The implementation registered for ``func`` on ``cls`` or a base, if any."""
    packet = getattr(func, "overloadpacket", None)
    for klass in cls.__mro__:
        table = klass.__dict__.get("_op_table")
        if table:
            fn = table.get(func)
            if fn is None and packet is not None:
                fn = table.get(packet)
            if fn is not None:
                return fn  # type: ignore[no-any-return]  # the table holds callables
    return None


def _identity(obj: object) -> int:
    return id(real_object(obj))


def _common_attrs(cls: Any, func: Any, instances: list[Any]) -> Any:
    proto = instances[0]
    for other in instances[1:]:
        for name in cls.opaque_attrs:
            a, b = getattr(proto, name), getattr(other, name)
            if _identity(a) != _identity(b):
                raise OpaqueSubclassError(
                    f"{subject(cls)}: {func} got arguments whose {name!r} are different "
                    f"{describe_type(a)} objects; the default rule needs one {name!r} for all "
                    f"arguments. Fix: bring the arguments to the same {name!r} first, or register "
                    f"an implementation with @{cls.__qualname__}.implements({func})."
                )
        for name in cls.meta_attrs:
            a, b = getattr(proto, name), getattr(other, name)
            if a != b:
                raise OpaqueSubclassError(
                    f"{subject(cls)}: {func} got arguments with different {name!r} ({a!r} and "
                    f"{b!r}). Fix: make the metadata agree first, or register an implementation "
                    f"with @{cls.__qualname__}.implements({func})."
                )
    return proto


def dispatch(cls: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``__torch_dispatch__`` of an ``OpaqueSubclass``: the op table, then the default rule."""
    impl = lookup(cls, func)
    try:
        if impl is not None:
            return impl(func, args, kwargs)
        return _default_rule(cls, func, args, kwargs)
    except TypeError as e:
        rule = "the default rule" if impl is None else f"the rule {getattr(impl, '__qualname__', impl)!s}"
        raise OpaqueSubclassError(
            f"{subject(cls)}: {rule} for {func} raised {type(e).__name__}: {e}. It is raised "
            "as OpaqueSubclassError, with the original chained above, because torch turns a TypeError "
            "inside a Python operator (x * 2) into NotImplemented, which would show only "
            "'unsupported operand type(s)'. Fix: correct the rule where the chained traceback points."
        ) from e


def _default_rule(cls: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    flat, spec = tree_flatten((args, kwargs))
    instances = [a for a in flat if isinstance(a, cls)]
    if not instances:
        return NotImplemented
    template = _common_attrs(cls, func, instances)
    results = []
    for name in cls.tensor_attrs:
        inner_args, inner_kwargs = tree_unflatten([getattr(a, name) if isinstance(a, cls) else a for a in flat], spec)
        results.append(func(*inner_args, **inner_kwargs))
    first_leaves, out_spec = tree_flatten(results[0])
    per_attr = [first_leaves] + [tree_flatten(r)[0] for r in results[1:]]
    wrapped = []
    for leaves in zip(*per_attr, strict=True):
        if isinstance(leaves[0], torch.Tensor):
            wrapped.append(template.wrap_like(**dict(zip(cls.tensor_attrs, leaves, strict=True))))
        else:
            wrapped.append(leaves[0])
    out = tree_unflatten(wrapped, out_spec)
    return return_and_correct_aliasing(func, args, kwargs, out)
