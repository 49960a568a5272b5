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
Dynamo prints the source, type found, a fix that runs as written), with the
checks of :mod:`opaque_subclass.core.checks`. A valid subclass reaches torch's
function unchanged, and they run while tracing, never on a compiled call.
Under Dynamo they call no user code that torch does not call: the
``__tensor_unflatten__`` check reads the fake instance torch rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.core.checks import (
    CheckedLevels,
    check_fake_rebuild,
    check_levels,
    source_name,
    validate_graph_input,
    validate_input,
)
from opaque_subclass.core.errors import OpaqueSubclassError
from opaque_subclass.core.flatten import is_wrapper_subclass
from opaque_subclass.patching import composes

__all__ = ["make_fakify", "make_get_plain_tensors", "make_wrap_tensor"]


def _name_the_cause(error: Exception, check: Callable[[], object]) -> None:
    """For an input torch's function failed on with ``error``: run ``check``
    (the library's checks of that input, which call the user's
    ``__tensor_unflatten__`` only now that torch has failed) and raise the
    library's error it finds *from* torch's; return when it finds none."""
    try:
        check()
    except OpaqueSubclassError as named:
        raise named from error


@composes
def make_wrap_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.builder.VariableBuilder.wrap_tensor``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's own fingerprint), where
    Dynamo first meets a tensor input of a compiled function.

    Without it, ``torch.compile`` of a function whose subclass argument lists an
    ``int`` (or an unregistered class) fails with torch's ``'int' found in
    tensor attrs of MeshTensor.__tensor_flatten__()``, which names neither the
    argument nor a fix. With it, the library's ``TypeError`` names the
    subclass, the path (``L['x']._mesh``), the type found and the fix. After
    torch's function has built the fake instance (with the user's
    ``__tensor_unflatten__`` on fake inner tensors), every level of that
    instance is compared with the real input's (type, shape, dtype): a
    ``__tensor_unflatten__`` that returns something else is named here, not
    in the backward's tangent check or an inductor crash. Each level is checked
    once per graph (Dynamo wraps inner subclasses again as inputs of their own);
    the record of what was checked belongs to this replacement.
    """

    checked = CheckedLevels()

    def wrap_tensor(self: Any, value: Any) -> Any:
        if not is_wrapper_subclass(value):
            return original(self, value)
        levels = validate_graph_input(self, value, checked)
        try:
            variable = original(self, value)
        except Exception as error:
            if levels:  # torch failed on this input: say why if a rebuild is wrong
                _name_the_cause(error, lambda: check_levels(levels))
            raise
        # the rebuild check on the fake torch built with the user's __tensor_unflatten__
        node = getattr(getattr(variable, "proxy", None), "node", None)
        fake = node.meta.get("example_value") if node is not None else None
        if levels and fake is not None:
            check_fake_rebuild(levels, fake)
        return variable

    return wrap_tensor


@composes
def make_fakify(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._export.non_strict_utils.fakify`` (torch 2.11, 2.12,
    2.13, 2.14 and 2.15: each release's own fingerprint), which makes the fake of each input of
    non-strict ``torch.export``: for a subclass, with the user's
    ``__tensor_unflatten__`` on fake inner tensors.

    Without it, a ``__tensor_unflatten__`` that returns another type, shape or
    dtype than the instance it rebuilds is exported silently (the plain tensor
    it returns is traced in the input's place), and a subclass input that lists
    an ``int`` fails with torch's bare ``AssertionError: expected Tensor or
    OpaqueBase`` (native opaque attributes, pytorch/pytorch#176457, do not name
    the input). With it, the fake torch built is compared level by level with
    the real input (type, shape, dtype), and when torch's own function fails
    on a subclass input the input is walked (and, only then, each level
    rebuilt once from the real input) to raise the library's error, naming the
    subclass, the input's path, what was found and the fix, from torch's.
    """

    def fakify(mode: Any, kp: Any, t: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_wrapper_subclass(t):
            return original(mode, kp, t, *args, **kwargs)
        # fakify(mode, kp, t, t_constraints, sources, sourced_prefixes=None), on every release
        path = _export_path(
            kp, kwargs["sourced_prefixes"] if "sourced_prefixes" in kwargs else (args[2:3] or [None])[0]
        )
        try:
            fake = original(mode, kp, t, *args, **kwargs)
        except Exception as error:
            _name_the_cause(error, lambda: check_levels(validate_input(t, path, rebuild=False)))
            raise
        check_fake_rebuild(validate_input(t, path, rebuild=False), fake)
        return fake

    return fakify


def _export_path(kp: Any, sourced_prefixes: Any) -> str:
    """How non-strict export names an input at key path ``kp`` (``L['x']``)."""
    from torch._export.non_strict_utils import key_path_to_source

    try:
        return source_name(key_path_to_source(kp, sourced_prefixes=sourced_prefixes))
    except Exception:  # an error message must never fail
        return "input"


@composes
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
