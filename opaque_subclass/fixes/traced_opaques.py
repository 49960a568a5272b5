"""Reference opaques made while torch traces (pytorch/pytorch#176044; torch 2.11 - 2.15).

A reference opaque made during a ``make_fx`` trace (in ``__torch_dispatch__``,
a fake kernel, or a forward under non-strict ``torch.export``) and passed to a
custom op is tracked by no graph input, so the FX tracer stores it on the
graph module (``get_attr``) and every call shares that one object. Measured
with an op counting its calls on it: eager 2, 2, 2; compiled 2, 4, 6 on every
release, ``aot_eager`` and inductor alike, silently; non-strict export 1, 2, 3
against eager 1, 1, 1 (strict export and Dynamo refuse it themselves: "An
opaque object was created in the middle of the program"). Doing it right needs
the constructor as a graph op, so the library refuses it by name (no release
fixes it; upstream attempts were not merged).

The metaclass ``__call__`` replacement records each reference opaque built
under an active tracer; the tracer's ``create_arg`` refuses one made under
itself. Unaffected: objects made before the trace, torch's own opaque types
(``DeviceMesh``, ``ProcessGroup``), value opaques, and classes not using
torch's opaque metaclass (not inheriting ``opaque_subclass.OpaqueBase``, like
``DeviceMesh`` on torch 2.11).
"""

from __future__ import annotations

import importlib
import sys
import weakref
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.errors import OpaqueValueError
from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.core.registry import is_torch_own_opaque_type, opaque_kind, real_object
from opaque_subclass.fixes import messages
from opaque_subclass.patching import composes

__all__ = ["OpaqueCreatedWhileTracingError", "make_create_arg", "make_metaclass_call"]

_PROXY_TENSOR = "torch.fx.experimental.proxy_tensor"


def _held(obj: object) -> Callable[[], object]:
    try:
        return weakref.ref(obj)
    except TypeError:  # a class with __slots__ and no __weakref__
        return lambda: obj


class OpaqueCreatedWhileTracingError(OpaqueValueError):
    """A reference opaque made while torch traced reached the graph, where it
    would be one constant shared by every call (pytorch/pytorch#176044).
    A :class:`ValueError`."""


def _active_tracer() -> Any:
    """The tracer of the ``make_fx`` trace running in this thread, if any."""
    proxy_tensor = sys.modules.get(_PROXY_TENSOR)
    if proxy_tensor is None:  # nothing has traced yet
        return None
    mode = proxy_tensor.get_proxy_mode()
    return getattr(mode, "tracer", None)


def _records(cls: type) -> bool:
    return not is_torch_own_opaque_type(cls) and opaque_kind(cls) == "reference"


@composes
def make_metaclass_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._opaque_base.OpaqueBaseMeta.__call__`` (torch 2.11,
    2.12 and 2.13; ``torch._custom_class_base.CustomClassBaseMeta.__call__`` on
    torch 2.14 and 2.15), inherited from ``type``: instance creation for torch's
    opaque base. A backport patch on torch 2.11 (pytorch/pytorch#176457, native
    from torch 2.12), a fix on 2.12 and newer.

    Without it, nothing tells an object made while tracing from an older one,
    and one made in ``__torch_dispatch__`` is compiled in as a constant
    (pytorch/pytorch#176044). With it, after ``type.__call__``, a user
    reference opaque made under this thread's ``make_fx`` tracer is recorded
    for ``PythonKeyTracer.create_arg`` to refuse; nothing is written on it.
    """

    def __call__(cls: type, *args: Any, **kwargs: Any) -> Any:
        obj = original(cls, *args, **kwargs)
        tracer = _active_tracer()
        if tracer is not None and _records(cls):  # per tracer: id(object) -> a (weak) reference to it
            RECORDER.put("traced_objects", tracer, id(obj), _held(obj))
        return obj

    return __call__


def _reconstructible(cls: type) -> bool:
    """Whether the class has a registered ``reconstruct`` (torch 2.12+)."""
    get = getattr(importlib.import_module("torch._library.opaque_object"), "get_reconstruct_fn", None)
    try:
        return get is not None and get(cls) is not None
    except Exception:  # an unregistered class, or a release without the registry entry
        return False


@composes
def make_create_arg(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.fx.experimental.proxy_tensor.PythonKeyTracer.create_arg``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15): how ``make_fx`` turns a traced
    op's argument into a graph node. A backport patch on torch 2.11
    (pytorch/pytorch#176457, native from torch 2.12), a fix on 2.12 and newer.

    Without it, a reference opaque made while tracing is a graph constant
    shared by every call: a counting op returns 2, 4, 6 where eager returns 2,
    2, 2 (pytorch/pytorch#176044), silently. With it, one recorded under this
    tracer that torch cannot rebuild raises
    :class:`OpaqueCreatedWhileTracingError` naming the class and fix; every
    other argument goes to torch's ``create_arg`` unchanged.
    """

    def create_arg(self: Any, a: object) -> Any:
        if RECORDER.has_any("traced_objects"):
            real = real_object(a)
            held = RECORDER.lookup("traced_objects", self, id(real))
            if held is not None and held() is real and not _reconstructible(type(real)):
                raise messages.created_while_tracing(OpaqueCreatedWhileTracingError, real)
        return original(self, a)

    return create_arg
