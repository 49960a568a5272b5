"""Reference opaques made while torch traces (pytorch/pytorch#176044; torch 2.11 - 2.15).

A tensor subclass's ``__torch_dispatch__`` (or a fake kernel, or a module's
``forward`` under non-strict ``torch.export``) that makes a *reference* opaque
and passes it to a custom op runs while AOTAutograd or ``torch.export`` traces
the program with ``make_fx``. No graph input tracks
that object, so torch's FX tracer stores it on the graph module and reads it
with ``get_attr``: every call of the compiled program then uses the one object
made while tracing, where eager makes a new one per call. Measured with an op
counting its calls on the object: eager 2, 2, 2; compiled 2, 4, 6 on every
release, ``aot_eager`` and inductor alike, with no error and no warning.
Non-strict ``torch.export`` of a forward that makes one is the same: the
exported module's calls return 1, 2, 3 where eager returns 1, 1, 1 (strict
export and Dynamo refuse an opaque made in the traced region themselves:
"An opaque object was created in the middle of the program"). Compiling it
right would need the constructor to be an operation of the graph, so the
library refuses it by name instead (no release refuses or fixes it; the
upstream attempts were not merged).

Two replacements share this module's record of what was made while tracing:
torch's opaque metaclass's ``__call__`` notes each reference opaque built
while a ``make_fx`` tracer is active (with that tracer), and the tracer's
``create_arg`` (where an object becomes a graph constant) refuses one made
under that very tracer. Objects that existed before the trace (graph inputs,
module attributes, globals read below Dynamo) are never in the record and keep
torch's behaviour; so do torch's own opaque types (``DeviceMesh``,
``ProcessGroup``), value opaques (constants by design) and classes that do not
use torch's opaque metaclass (registered without inheriting
``opaque_subclass.OpaqueBase``, like ``DeviceMesh`` on torch 2.11).
"""

from __future__ import annotations

import importlib
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.errors import OpaqueValueError, import_fix, subject
from opaque_subclass.core.registry import is_torch_own_opaque_type, opaque_kind, real_object
from opaque_subclass.patching import composes

__all__ = ["OpaqueCreatedWhileTracingError", "make_create_arg", "make_metaclass_call"]

_PROXY_TENSOR = "torch.fx.experimental.proxy_tensor"

_LOCK = threading.Lock()
#: tracer -> {id(object): a weak reference to it (the object itself when it takes none)} of the
#: reference opaques made while that tracer traced.
_MADE: weakref.WeakKeyDictionary[Any, dict[int, Callable[[], object]]] = weakref.WeakKeyDictionary()


def _held(obj: object) -> Callable[[], object]:
    try:
        return weakref.ref(obj)
    except TypeError:  # a class with __slots__ and no __weakref__
        return lambda: obj


class OpaqueCreatedWhileTracingError(OpaqueValueError):
    """A reference opaque made while torch traced the program (in a subclass's
    ``__torch_dispatch__`` or a fake kernel) reached the graph:
    torch would compile that one object in as a constant that every call
    shares (pytorch/pytorch#176044), where eager makes a new one per call.
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
    torch 2.14 and 2.15), which the metaclass inherits from ``type``: building
    an instance of a class derived from torch's opaque base. On torch 2.11 it
    is one of the backport's patches (the feature of pytorch/pytorch#176457,
    native from torch 2.12), on 2.12 and newer a fix.

    Without it, nothing tells an object made while torch traces from one that
    existed before, and torch compiles a reference opaque made in a subclass's
    ``__torch_dispatch__`` into the graph as a constant (pytorch/pytorch#176044).

    With it, the instance is built by ``type.__call__`` as before; when a
    ``make_fx`` tracer is active in this thread and the class is a reference
    opaque of the user's (not ``DeviceMesh`` or ``ProcessGroup``), the object
    is recorded with that tracer, for ``PythonKeyTracer.create_arg`` (this
    module) to refuse. Nothing is written on the object or its class.
    """

    def __call__(cls: type, *args: Any, **kwargs: Any) -> Any:
        obj = original(cls, *args, **kwargs)
        tracer = _active_tracer()
        if tracer is not None and _records(cls):
            with _LOCK:
                _MADE.setdefault(tracer, {})[id(obj)] = _held(obj)
        return obj

    return __call__


def _reconstructible(cls: type) -> bool:
    """Whether torch can rebuild such an object from the graph's inputs (a
    ``reconstruct`` registered with the class, torch 2.12+)."""
    get = getattr(importlib.import_module("torch._library.opaque_object"), "get_reconstruct_fn", None)
    try:
        return get is not None and get(cls) is not None
    except Exception:  # an unregistered class, or a release without the registry entry
        return False


def _message(obj: object) -> str:
    cls = type(obj)
    pass_in = import_fix(cls, 'opaque_subclass.register_opaque({cls}, kind="value")')
    return (
        f"a reference opaque {subject(cls)} was created while torch traced the program (in a tensor "
        f"subclass's __torch_dispatch__, a fake kernel, or a forward under non-strict torch.export) and "
        f"used by the graph: torch would compile "
        f"that one object into the graph as a constant, shared by every call, where eager creates a new "
        f"one per call (pytorch/pytorch#176044: silently wrong results). Fix: create it outside the "
        f"compiled function and pass it in (an argument, or an attribute the subclass lists in "
        f"__tensor_flatten__), or, if it never changes, register it as a value opaque: {pass_in}"
    )


@composes
def make_create_arg(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.fx.experimental.proxy_tensor.PythonKeyTracer.create_arg``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15): how ``make_fx`` (AOTAutograd,
    ``torch.export``) turns an argument of a traced operation into a node of
    the graph. On torch 2.11 it is one of the backport's patches (the feature
    of pytorch/pytorch#176457, native from torch 2.12), on 2.12 and newer a fix.

    Without it, a reference opaque made while tracing (a subclass's
    ``__torch_dispatch__`` creating a handle and passing it to a custom op)
    is stored on the graph module as a constant, and every call of the
    compiled program shares that one object: an op counting its calls on it
    returns 2, 4, 6 where eager returns 2, 2, 2 (pytorch/pytorch#176044),
    silently.

    With it, such an object (recorded by the metaclass's ``__call__`` of this
    module, made under this very tracer, that torch cannot rebuild from the
    graph's inputs) raises :class:`OpaqueCreatedWhileTracingError`, naming its
    class and the fix. Every other argument, graph inputs and objects made
    before the trace included, goes to torch's ``create_arg`` unchanged.
    """

    def create_arg(self: Any, a: object) -> Any:
        made = _MADE.get(self) if _MADE else None
        if made:
            real = real_object(a)
            held = made.get(id(real))
            if held is not None and held() is real and not _reconstructible(type(real)):
                raise OpaqueCreatedWhileTracingError(_message(real))
        return original(self, a)

    return create_arg
