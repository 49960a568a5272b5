"""Named errors where native torch first walks a subclass input (torch 2.12 - 2.15).

torch 2.12+ handles opaque attributes itself, but an attribute that is neither
a tensor nor a registered reference opaque (an ``int``, ``None``, an
unregistered class, a value opaque) fails with torch's own short message, for
example ``RuntimeError: 'int' found in tensor attrs of MeshTensor.__tensor_flatten__()``
under ``torch.compile`` or ``AssertionError: expected Tensor or OpaqueBase``
under non-strict ``torch.export``: neither names the argument's path nor says
what to do. These fixes check every level of the subclass first, at the point
where torch meets the input, and raise the library's error (subclass, path as
Dynamo prints the source, type found, a fix that runs as written). They only
read; a valid subclass reaches torch's function unchanged, and they run while
tracing, never on a compiled call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.backport._machinery.hiding import source_name, validate_input
from opaque_subclass.backport._machinery.patching import Patch
from opaque_subclass.core.flatten import is_wrapper_subclass

__all__ = ["symbolic_context_patch", "wrap_tensor_patch"]


def make_wrap_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.builder.VariableBuilder.wrap_tensor``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's own fingerprint), where
    Dynamo first meets a tensor input of a compiled function.

    Without it, ``torch.compile`` of a function whose subclass argument lists an
    ``int`` (or an unregistered class) fails with torch's ``'int' found in
    tensor attrs of MeshTensor.__tensor_flatten__()``, which names neither the
    argument nor a fix. With it, the library's ``TypeError`` names the
    subclass, the path (``L['x']._mesh``), the type found and the fix.
    """

    def wrap_tensor(self: Any, value: Any) -> Any:
        if is_wrapper_subclass(value):
            validate_input(value, source_name(self.source))
        return original(self, value)

    return wrap_tensor


def make_symbolic_context(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._export.non_strict_utils._create_symbolic_context_for_tensor``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's own fingerprint), where
    non-strict ``torch.export`` first meets a tensor input.

    Without it, non-strict export of a subclass input that lists an ``int``
    fails with torch's bare ``AssertionError: expected Tensor or OpaqueBase``.
    With it, the library's ``TypeError`` names the subclass, the input's path
    (``L['x']._mesh``), the type found and the fix, as on torch 2.11.
    """

    def _create_symbolic_context_for_tensor(t: Any, source: Any, *args: Any, **kwargs: Any) -> Any:
        if is_wrapper_subclass(t):
            validate_input(t, source_name(source))
        return original(t, source, *args, **kwargs)

    return _create_symbolic_context_for_tensor


def wrap_tensor_patch(fingerprint: str) -> Patch:
    """The Dynamo fix, for a release whose original has ``fingerprint``."""
    return Patch("torch._dynamo.variables.builder.VariableBuilder.wrap_tensor", fingerprint, make_wrap_tensor)


def symbolic_context_patch(fingerprint: str) -> Patch:
    """The non-strict export fix, for a release whose original has ``fingerprint``."""
    return Patch(
        "torch._export.non_strict_utils._create_symbolic_context_for_tensor", fingerprint, make_symbolic_context
    )
