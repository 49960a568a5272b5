"""Named errors where torch first walks a subclass input (torch 2.12 - 2.15; the
plain-tensor walk also on 2.11).

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

from opaque_subclass.backport._machinery.hiding import source_name, validate_graph_input, validate_input
from opaque_subclass.backport._machinery.patching import Patch
from opaque_subclass.core.errors import OpaqueSubclassError
from opaque_subclass.core.flatten import is_wrapper_subclass

__all__ = ["plain_tensors_patch", "symbolic_context_patch", "wrap_tensor_patch"]


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
            validate_graph_input(self, value)
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


def make_get_plain_tensors(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._subclasses.fake_tensor.get_plain_tensors`` (torch 2.11,
    2.12, 2.13, 2.14 and 2.15: each release's own fingerprint), torch's walk of a subclass's inner
    values, which ``torch._guards.detect_fake_mode`` runs on every input of
    non-strict ``torch.export`` before anything else looks at them.

    Without it, a subclass input whose ``__tensor_flatten__`` returns its names
    as a set, a generator or ``None``, a name that is not a string, or a name
    of a missing attribute fails inside torch (``TypeError: 'set' object is not
    reversible``, ``AttributeError: 'MeshTensor' object has no attribute
    '_nope'``), naming neither the method at fault nor a fix; torch 2.12+'s
    native opaque attributes (pytorch/pytorch#176457) do not check these
    either. With it, when
    torch's walk raises, the library walks the same input and raises its
    named error (the subclass, the path from ``input``, what was found, the
    fix) *from* torch's. Diagnostic only: torch's function runs first and
    unchanged, so a valid input costs one ``try`` block; nothing changes on a
    compiled call.
    """

    def get_plain_tensors(subclass: Any, *, out: list[Any]) -> list[Any]:
        try:
            return original(subclass, out=out)  # type: ignore[no-any-return]  # torch's list
        except Exception as error:
            if is_wrapper_subclass(subclass):
                try:
                    validate_input(subclass, "input")
                except (TypeError, ValueError, AttributeError, OpaqueSubclassError) as named:
                    raise named from error
            raise

    return get_plain_tensors


def plain_tensors_patch(fingerprint: str) -> Patch:
    """The fix of torch's plain-tensor walk, for a release whose original has ``fingerprint``."""
    return Patch("torch._subclasses.fake_tensor.get_plain_tensors", fingerprint, make_get_plain_tensors)


#: Dynamo's type-dispatch table, built once from ``VariableBuilder.wrap_tensor`` (among others)
TYPE_DISPATCH = "torch._dynamo.variables.builder.VariableBuilder._type_dispatch_impl"


def wrap_tensor_patch(fingerprint: str) -> Patch:
    """The Dynamo fix, for a release whose original has ``fingerprint``."""
    return Patch(
        "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor",
        fingerprint,
        make_wrap_tensor,
        caches=(TYPE_DISPATCH,),
    )


def symbolic_context_patch(fingerprint: str) -> Patch:
    """The non-strict export fix, for a release whose original has ``fingerprint``."""
    return Patch(
        "torch._export.non_strict_utils._create_symbolic_context_for_tensor", fingerprint, make_symbolic_context
    )
