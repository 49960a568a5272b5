"""Cheaper guards on a subclass input whose flatten is the same for every
instance (torch 2.11 - 2.15).

For every subclass input Dynamo installs two guards written in Python, both
calling ``__tensor_flatten__`` on every call of the compiled code
(``VariableBuilder.wrap_tensor``):

* ``TENSOR_SUBCLASS_METADATA_MATCH``: the flatten context compared with the
  traced one (``___check_metadata_...``);
* ``EQUALS_MATCH`` on ``SubclassAttrListSource``: the attribute list compared
  with the traced one (``x.__tensor_flatten__()[0] == [...]``).

They are most of what a compiled call pays per subclass input above reading
its leaves (benchmarks/bench_per_call.py: 2 x 0.2 us per input and level). For
a class whose ``__tensor_flatten__`` returns the same list and context for
every instance they never fail while the class keeps that function, so for
such a class both are replaced by:

* one guard per class and compiled frame, checking that the class still has
  the traced function (same function object, same code; for an
  :class:`~opaque_subclass.OpaqueSubclass`, the same constant flatten): a
  replaced method (``opaque_subclass.adopt``, a monkeypatch) recompiles, with
  the reason ``___check_constant_flatten_...``;
* per input, torch's own ``not ___dict_contains('__tensor_flatten__',
  x.__dict__)`` (a check in C++): an instance's own ``__tensor_flatten__``
  would shadow the class's.

The input's type is checked by the ``TENSOR_MATCH`` and ``TYPE_MATCH`` guards
Dynamo installs beside these for every tensor input, on every release.

"The same for every instance" is proven, not assumed. A class qualifies when
its flatten lists a registered opaque (classes without opaques keep torch's
guards: code that never uses the library sees torch unchanged), it has no
``__metadata_guard__`` and no ``__getattribute__`` of its own, and either

* its ``__tensor_flatten__`` is a plain function whose code only builds its
  result from constants (``return ["_data", "_mesh"], None``): no name,
  attribute, argument or call is read; or
* it is an :class:`~opaque_subclass.OpaqueSubclass` without ``meta_attrs``
  (``_opaque_constant_flatten()``: the class's attribute names and an empty context).

Every other class keeps torch's two guards, unchanged.
"""

from __future__ import annotations

import dataclasses
import dis
import inspect
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.core.registry import is_opaque
from opaque_subclass.patching import composes

__all__ = ["constant_flatten", "make_attr_list_guard", "make_metadata_guard"]

_FLATTEN = "__tensor_flatten__"
# Opcodes of a function that builds its result from constants only (CPython 3.10 - 3.13).
_CONSTANT_OPS = frozenset(
    {"RESUME", "NOP", "CACHE", "EXTENDED_ARG", "LOAD_CONST", "LOAD_SMALL_INT", "RETURN_VALUE", "RETURN_CONST",
     "BUILD_LIST", "BUILD_TUPLE", "BUILD_MAP", "BUILD_CONST_KEY_MAP", "BUILD_SET", "LIST_EXTEND", "SET_UPDATE",
     "LIST_TO_TUPLE"}
)  # fmt: skip
_NOT_CONSTANT_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _builds_constants_only(fn: types.FunctionType) -> bool:
    code = fn.__code__
    if code.co_flags & _NOT_CONSTANT_FLAGS:
        return False
    return all(ins.opname in _CONSTANT_OPS for ins in dis.get_instructions(code))


@dataclasses.dataclass(frozen=True)
class _ClassFlatten:
    """What makes a class's flatten constant, checked again on every call."""

    cls: type
    function: types.FunctionType
    code: types.CodeType
    # OpaqueSubclass: the class's own constant flatten (compared by ==); None otherwise
    declared: Any

    def holds(self) -> bool:
        function = self.function
        if getattr(self.cls, _FLATTEN) is not function or function.__code__ is not self.code:
            return False
        return self.declared is None or self.cls._opaque_constant_flatten() == self.declared  # type: ignore[attr-defined]


def constant_flatten(value: Any) -> _ClassFlatten | None:
    """Why ``value``'s class flattens every instance alike, or ``None`` when it may not (or lists no opaque)."""
    cls: Any = type(value)
    instance_dict = getattr(value, "__dict__", None)
    if instance_dict is None or _FLATTEN in instance_dict:
        return None
    if hasattr(cls, "__metadata_guard__") or cls.__getattribute__ is not torch.Tensor.__getattribute__:
        return None
    function = inspect.getattr_static(cls, _FLATTEN, None)
    if not isinstance(function, types.FunctionType):
        return None
    declared = None
    constant = getattr(cls, "_opaque_constant_flatten", None)
    if constant is not None and inspect.ismethod(constant):
        declared = constant()
        if declared is None:
            return None
    elif not _builds_constants_only(function):
        return None
    names, _ = value.__tensor_flatten__()
    if not any(is_opaque(getattr(value, name, None)) for name in names):
        return None
    return _ClassFlatten(cls, function, function.__code__, declared)


# builder -> classes whose guard it installed (one per class and compiled frame)
_GUARDED: weakref.WeakKeyDictionary[Any, set[type]] = weakref.WeakKeyDictionary()


def _guard_class(builder: Any, flatten: _ClassFlatten, guard: Any) -> None:
    from torch._dynamo.guards import get_verbose_code_parts

    done = _GUARDED.setdefault(builder, set())
    if flatten.cls in done:
        return
    done.add(flatten.cls)
    holds = flatten.holds

    def constant_flatten_match(_: object) -> bool:
        return holds()

    code = f"___check_constant_flatten_{id(constant_flatten_match)}"
    builder.guard_manager.root.add_lambda_guard(
        constant_flatten_match, get_verbose_code_parts(code, guard), guard.user_stack
    )


def _guard_instance(builder: Any, guard: Any) -> None:
    """torch's ``not ___dict_contains('__tensor_flatten__', x.__dict__)`` on the input of ``guard``."""
    builder.NOT_PRESENT_IN_GENERIC_DICT(guard, attr=_FLATTEN)


def _keep_torch_attributes(replacement: Callable[..., Any], original: Callable[..., Any]) -> None:
    # what torch attached to its method (2.12+: the check spec, read by guard serialization)
    vars(replacement).update(vars(original))


@composes
def make_metadata_guard(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.guards.GuardBuilder.TENSOR_SUBCLASS_METADATA_MATCH``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15: each release's fingerprint), the
    Python guard comparing a subclass input's flatten context on every call.

    Without it, a subclass input with opaques (torch's native path since 2.12,
    pytorch/pytorch#176457; the backport's on 2.11) pays that guard, a Python
    call of ``__tensor_flatten__``, on every call, even when its class flattens
    every instance alike. With it, such a class (:func:`constant_flatten`) is guarded
    once per class and frame and, per input, by a C++ check that the instance
    has no ``__tensor_flatten__`` of its own; every other class keeps torch's
    guard.
    """

    def TENSOR_SUBCLASS_METADATA_MATCH(self: Any, guard: Any) -> None:  # torch's guard names are upper case
        flatten = constant_flatten(self.get(guard))
        if flatten is None:
            original(self, guard)
            return
        _guard_class(self, flatten, guard)
        _guard_instance(self, guard)

    _keep_torch_attributes(TENSOR_SUBCLASS_METADATA_MATCH, original)
    return TENSOR_SUBCLASS_METADATA_MATCH


@composes
def make_attr_list_guard(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.guards.GuardBuilder.EQUALS_MATCH`` (torch 2.11,
    2.12, 2.13, 2.14 and 2.15: each release's fingerprint) for one source only:
    ``SubclassAttrListSource``, the attribute list of a subclass input
    (``x.__tensor_flatten__()[0] == [...]``, a Python call on every call).

    Without it, every subclass input with opaques (torch's native path since
    2.12, pytorch/pytorch#176457; the backport's on 2.11) pays that call. With it, the
    list of a class that flattens every instance alike (:func:`constant_flatten`)
    is guarded by the class guard of :func:`make_metadata_guard`; every other
    source and class goes to torch's ``EQUALS_MATCH`` unchanged.
    """

    def EQUALS_MATCH(self: Any, guard: Any, *args: Any, **kwargs: Any) -> None:
        from torch._dynamo.source import SubclassAttrListSource

        source = guard.originating_source
        if type(source) is SubclassAttrListSource:
            flatten = constant_flatten(self.get(source.base))
            if flatten is not None:
                on_input = dataclasses.replace(guard, originating_source=source.base)
                _guard_class(self, flatten, on_input)
                _guard_instance(self, on_input)
                return
        original(self, guard, *args, **kwargs)

    _keep_torch_attributes(EQUALS_MATCH, original)
    return EQUALS_MATCH
