"""torch's protocol probes on opaque objects, asked of the class (torch 2.11 -
2.15).

torch decides how to treat a non-tensor object by asking the *instance*
whether it has a protocol attribute (``hasattr(x, "tracing_mode")`` for a
TorchScript object that traces with real values). A registered opaque whose
class defines ``__getattr__`` answering every name (a proxy, a config object
forwarding lookups, ``lambda *a: self``) says yes to every such question, and
torch calls what it got back.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.patching import composes

__all__ = ["make_tracing_with_real"]

_MISSING = object()


@composes
def make_tracing_with_real(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._library.fake_class_registry.tracing_with_real`` (torch
    2.11, 2.12, 2.13, 2.14 and 2.15, one fingerprint), which torch asks of
    every opaque object it turns into its fake wrapper while tracing (Dynamo,
    AOTAutograd, ``torch.export``; opaque attributes of subclasses since
    pytorch/pytorch#176457, and the backport's on 2.11).

    Without it, a registered opaque whose class defines ``__getattr__``
    answering every name is taken for a TorchScript object that traces with
    real values, because ``hasattr(obj, "tracing_mode")`` is true: torch then
    calls ``obj.tracing_mode()`` and every ``torch.compile`` and strict
    ``torch.export`` of a subclass holding it (or taking it as an argument)
    fails inside torch (``AssertionError: tracing_mode can be either real or
    fake but got <the object>``, or ``TypeError: '...' object is not
    callable`` when ``__getattr__`` returns the object itself). With it, for a
    registered Python opaque the question is asked without running its
    ``__getattr__`` (an attribute it invents is not a protocol): the object becomes a graph
    input as any other opaque and compiled code gives eager's results. A class
    that defines ``tracing_mode`` itself, and every TorchScript object, reach
    torch's function unchanged.
    """

    def tracing_with_real(x: Any) -> Any:
        # A static lookup (instance dict, then the class's MRO) never runs
        # __getattr__ or __getattribute__; TorchScript objects are not registered.
        if opaque_kind(type(x)) is not None and inspect.getattr_static(x, "tracing_mode", _MISSING) is _MISSING:
            return False
        return original(x)

    return tracing_with_real
