"""Dispatch for :class:`~opaque_subclass.OpaqueSubclass`: the per-class op
table, and the default rule for ops without an entry.

The default rule applies the op to each inner tensor attribute in turn (every
``OpaqueSubclass`` argument of the class replaced by that attribute), then
rewraps every tensor result with the arguments' opaques and metadata via
:meth:`OpaqueSubclass.wrap_like`. All arguments of the class must carry the same
opaque objects (by identity, seen through torch's fake wrappers) and equal
metadata, or the op has no single meaning and an
:class:`~opaque_subclass.OpaqueSubclassError` says which attribute differs.
Results go through torch's ``return_and_correct_aliasing`` so in-place and view
ops keep plain-tensor aliasing semantics.

A ``TypeError`` raised by a rule (a registered one, or the default rule's
``wrap_like``) leaves :func:`dispatch` as an ``OpaqueSubclassError`` with it
chained: torch's Python operators (``Tensor.__mul__`` and the others) turn a
``TypeError`` from anywhere below them into ``NotImplemented``, so ``x * 2``
would report only ``unsupported operand type(s)``, hiding the rule's message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_unflatten

from opaque_subclass.authoring import messages
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
                raise messages.opaques_differ(cls, func, name, a)
        for name in cls.meta_attrs:
            a, b = getattr(proto, name), getattr(other, name)
            if a != b:
                raise messages.metadata_differs(cls, func, name, a, b)
    return proto


def dispatch(cls: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``__torch_dispatch__`` of an ``OpaqueSubclass``: the op table, then the default rule."""
    impl = lookup(cls, func)
    try:
        if impl is not None:
            return impl(func, args, kwargs)
        return _default_rule(cls, func, args, kwargs)
    except TypeError as e:
        raise messages.rule_raised_type_error(cls, func, impl, e) from e


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
