"""Callable value opaques read off a subclass tensor made in the compiled region
(pytorch/pytorch#188796; torch 2.12 - 2.14).

A value opaque is a constant of the program (a quantizer-like config compared
with ``==``). When a tensor subclass made *inside* the compiled region carries
one (in its flatten context) and compiled code reads it off the tensor,
Dynamo treats the attribute as constant metadata only when it is not callable:
a value opaque that defines ``__call__`` falls through to a generic attribute
variable, and calling one of its methods (``y._config.factor()``) or the
object itself (``y._config(y)``) is a graph break (``Unsupported`` under
``fullgraph=True``). Never a wrong result. torch 2.15 takes value opaques as
constant metadata whether callable or not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.registry import opaque_kind, real_object
from opaque_subclass.patching import composes

__all__ = ["make_dynamic_getattr"]


def _callable_value_opaque(fake: Any, name: str) -> Any:
    """The attribute ``name`` of the subclass tensor ``fake`` when it is a
    callable value opaque that ``__tensor_flatten__`` does not list, else ``None``."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(fake) or name in fake.__tensor_flatten__()[0]:
        return None
    value = getattr(fake, name, None)
    if value is None or real_object(value) is not value or not callable(value):
        return None
    return value if opaque_kind(value) == "value" else None


@composes
def make_dynamic_getattr(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr``
    (torch 2.12, 2.13 and 2.14; pytorch/pytorch#188796, fixed in torch 2.15).

    Without it, a value opaque that defines ``__call__``, read off a subclass
    tensor made inside the compiled region (``y = t + 1; y._config.factor()``),
    becomes a generic attribute variable, and a call of its method or of the
    object is a graph break (``Unsupported`` with ``fullgraph=True``).

    With it, such an attribute (not listed by ``__tensor_flatten__``, a
    registered value opaque, callable) of a tensor without a source is built
    as the constant it is, as a non-callable one is, so its declared members
    and ``__call__`` compile into one graph (torch 2.15's behaviour). Every
    other attribute goes to torch's function unchanged.
    """
    build = importlib.import_module("torch._dynamo.variables.base").VariableTracker.build

    def dynamic_getattr(self: Any, tx: Any, name: str) -> Any:
        if not self.source:
            value = _callable_value_opaque(self.proxy.node.meta.get("example_value"), name)
            if value is not None:
                return build(tx, value)
        return original(self, tx, name)

    return dynamic_getattr
