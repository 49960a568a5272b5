"""Named errors where torch first walks a subclass input (torch 2.12 - 2.15; the
plain-tensor walk also on 2.11).

On torch 2.12+ a listed attribute that is neither tensor nor registered
reference opaque (``int``, ``None``, unregistered class, value opaque) fails
with a short message naming no path or fix (``RuntimeError: 'int' found in
tensor attrs of MeshTensor.__tensor_flatten__()`` under ``torch.compile``,
``AssertionError: expected Tensor or OpaqueBase`` under non-strict
``torch.export``). These fixes check every level where torch meets the input
(:mod:`opaque_subclass.core.checks`) and raise the library's error (subclass,
Dynamo-style path, type, a working fix). Valid input reaches torch unchanged;
checks run only while tracing and, under Dynamo, call no user code torch does
not (the ``__tensor_unflatten__`` check reads torch's fake rebuild).
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
    """After torch failed with ``error``, run ``check`` (only now calling the
    user's ``__tensor_unflatten__``) and raise its error *from* torch's, if any."""
    try:
        check()
    except OpaqueSubclassError as named:
        raise named from error


@composes
def make_wrap_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.builder.VariableBuilder.wrap_tensor``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's own fingerprint), where
    Dynamo first meets a tensor input of a compiled function.

    Without it, a subclass argument listing an ``int`` (or unregistered class)
    fails with torch's ``'int' found in tensor attrs of
    MeshTensor.__tensor_flatten__()``, naming no argument or fix. With it, a
    ``TypeError`` names subclass, path (``L['x']._mesh``), type and fix, and
    each level of torch's fake rebuild is compared with the real input (type,
    shape, dtype), so a wrong ``__tensor_unflatten__`` is named here, not in the
    tangent check or an inductor crash. Each level is checked once per graph
    (this replacement's own record).
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
    2.13, 2.14 and 2.15: each release's own fingerprint), which fakes each input
    of non-strict ``torch.export`` (a subclass via the user's ``__tensor_unflatten__``).

    Without it, a ``__tensor_unflatten__`` returning another type, shape or
    dtype is exported silently, and a subclass listing an ``int`` fails with a
    bare ``AssertionError: expected Tensor or OpaqueBase`` (native opaque
    attributes, pytorch/pytorch#176457, name no input). With it, the fake is
    compared level by level with the real input, and when torch fails the
    input is walked (only then rebuilt) to raise the library's named error
    from torch's.
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
    2.12, 2.13, 2.14 and 2.15: each release's own fingerprint), the walk
    ``torch._guards.detect_fake_mode`` runs first on every non-strict
    ``torch.export`` input.

    Without it, ``__tensor_flatten__`` names as a set, generator or ``None``, a
    non-string name, or a missing attribute fail inside torch (``TypeError:
    'set' object is not reversible``, ``AttributeError: 'MeshTensor' object has
    no attribute '_nope'``), naming no method or fix; torch 2.12+
    (pytorch/pytorch#176457) does not check these either. With it, when
    torch's walk raises, the library walks the input and raises its named error
    *from* torch's. Diagnostic only: a valid input costs one ``try``.
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
