"""Subclass parameters as parametrizations over plain tensor leaves.

:func:`unwrap_subclass_parameters` parametrizes every wrapper-subclass parameter
and buffer: the module stores the *leaves* (tensors as parameters/buffers,
opaques as plain attributes, identity kept) and ``module.weight`` rebuilds the
subclass on access, so exporters, optimizers and the state dict see only tensors.

``torch.export`` records the rebuild only for exportable-marked constructors
(:class:`~opaque_subclass.OpaqueSubclass`'s is); for others, exporting raises a
clear error instead of torch's ``Unable to cast NotImplemented to Tensor``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.nn.utils import parametrize

from opaque_subclass.core.checks import require_module
from opaque_subclass.core.codegen import compiled_wrap
from opaque_subclass.core.errors import (
    OpaqueSubclassError,
    OpaqueTypeError,
    describe_type,
    qualified_name,
    submodule_expression,
)
from opaque_subclass.core.flatten import flatten_subclass, is_wrapper_subclass
from opaque_subclass.core.spec import SubclassLayout, iter_subclasses

__all__ = ["UnwrapSubclass", "is_exportable_constructor", "unwrap_subclass_parameters"]


class UnwrapSubclass(torch.nn.Module):
    """The parametrization: ``right_inverse`` flattens, ``forward`` rebuilds.

    ``right_inverse(x)`` returns ``x``'s leaves in flat-slot order and keeps its
    structure; ``forward(*leaves)`` rebuilds it with generated straight-line code.
    ``path`` names the tensor in error messages (``"layer.w"``).
    """

    spec: SubclassLayout | None

    def __init__(self, path: str | None = None) -> None:
        super().__init__()
        self.spec = None
        self.path = path
        self._rebuild: Any = None
        # The error to raise under torch.export, computed once by right_inverse.
        self._export_error: str | None = None

    def forward(self, *leaves: Any) -> torch.Tensor:
        if self._rebuild is None:
            raise OpaqueSubclassError(
                "UnwrapSubclass.forward called before right_inverse: it was called directly, or registered "
                "without unsafe=True. Fix: let the library parametrize every subclass parameter, "
                "`import opaque_subclass; opaque_subclass.unwrap_subclass_parameters(module)` "
                "(module: the module holding the parameter), or register it with "
                "torch.nn.utils.parametrize.register_parametrization(module, name, UnwrapSubclass(), unsafe=True)."
            )
        if self._export_error is not None and _is_exporting():
            raise OpaqueSubclassError(self._export_error)
        return self._rebuild(leaves)  # type: ignore[no-any-return]  # a subclass instance

    def right_inverse(self, value: torch.Tensor) -> list[Any]:
        leaves, spec = flatten_subclass(value)
        if not isinstance(spec, SubclassLayout):
            raise OpaqueTypeError(
                f"UnwrapSubclass expects a wrapper subclass, got {describe_type(value)}. Fix: "
                "parametrize only subclass parameters (unwrap_subclass_parameters does)."
            )
        safe = spec.runtime_safe()
        self.spec = safe
        # traced by torch.compile with the module: no look at the opaques, checked just above
        self._rebuild = compiled_wrap(safe, checked=False)
        self._export_error = _export_error(safe, self.path)
        return leaves


def _is_exporting() -> bool:
    """Whether torch.export is tracing, also inside Dynamo, from export's flag: torch
    2.11's Dynamo folds ``torch.compiler.is_exporting()`` to True under every
    ``torch.compile`` (2.12+ reads the flag itself)."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


@functools.cache
def _marker_code() -> Any:
    """The code object of the wrappers torch's exportable-constructor marker makes."""
    from torch._export.wrappers import mark_subclass_constructor_exportable_experimental

    def __init__(self: Any) -> None:
        pass

    return mark_subclass_constructor_exportable_experimental(__init__).__code__


def is_exportable_constructor(cls: type) -> bool:
    """Whether ``torch.export`` can record constructing ``cls``: its ``__init__``
    (under any ``functools.wraps`` decorators) is wrapped by
    ``torch._export.wrappers.mark_subclass_constructor_exportable_experimental``."""
    marker = _marker_code()
    fn: Any = getattr(cls, "__init__", None)
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        if getattr(fn, "__code__", None) is marker:
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _export_error(spec: SubclassLayout, path: str | None) -> str | None:
    """The error for exporting an unrecordable rebuild of ``spec``, else ``None``."""
    name = path or "x"
    unmarked = [
        (p, m.subclass_type) for p, m in iter_subclasses(spec, name) if not is_exportable_constructor(m.subclass_type)
    ]
    if not unmarked:
        return None
    where = ", ".join(f"{qualified_name(t)} at '{p}'" for p, t in unmarked)
    owner, _, attr = name.rpartition(".")
    first = unmarked[0][1].__name__
    return (
        f"torch.export cannot rebuild the parametrized tensor '{name}' made by unwrap_subclass_parameters: "
        f"it constructs {where} while tracing, and torch.export records a subclass construction only when "
        "the class's __init__ is marked with torch._export.wrappers.mark_subclass_constructor_exportable_experimental "
        "(without it, torch fails later with 'RuntimeError: Unable to cast NotImplemented to Tensor'). "
        f"Fix: export the subclass parameter itself, which torch.export handles: "
        f"`torch.nn.utils.parametrize.remove_parametrizations({submodule_expression(owner)}, {attr!r})` "
        f"(module being the exported module); or make {first} recordable: derive it from "
        "opaque_subclass.OpaqueSubclass, or decorate its __init__ with @torch._disable_dynamo and "
        "@mark_subclass_constructor_exportable_experimental (its arguments must then be tensors, opaques, "
        "ints, floats, bools or strings)."
    )


def unwrap_subclass_parameters(module: torch.nn.Module) -> torch.nn.Module:
    """Parametrize every wrapper-subclass parameter and buffer of ``module`` (and
    submodules) over its plain leaves, in place; returns ``module``. Then for a
    subclass ``w``: ``module.w`` returns it with the very same opaques;
    ``module.parametrizations.w.original{i}`` are its leaves (tensors as
    parameters following ``w``'s ``requires_grad``, or buffers; opaques as plain
    attributes); ``module.state_dict()`` holds only tensors.

    Works on torch 2.11 (with the backport) and on torch >= 2.12.
    """
    require_module(module, "opaque_subclass.unwrap_subclass_parameters")
    for prefix, sub in module.named_modules():
        names = [n for n, p in sub.named_parameters(recurse=False) if is_wrapper_subclass(p)]
        names += [n for n, b in sub.named_buffers(recurse=False) if is_wrapper_subclass(b)]
        for name in names:
            if parametrize.is_parametrized(sub, name):
                continue
            path = f"{prefix}.{name}" if prefix else name
            parametrize.register_parametrization(sub, name, UnwrapSubclass(path), unsafe=True)
    return module
