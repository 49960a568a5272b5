"""``torch.export`` with opaque attributes (torch 2.11).

* Non-strict export builds a symbolic (shape) context for every input tensor and
  for every attribute its ``__tensor_flatten__`` names; torch 2.11 treats an
  opaque attribute as a tensor there and fails (``'Mesh' object has no attribute
  'shape'``).
* After :func:`opaque_subclass.unwrap_tensor_subclass_parameters`, an opaque is a
  plain module attribute the exported graph reads; export lifts it as a custom
  object input and the unlifted module puts it back. torch 2.11 lifts only
  tensors and script objects there.

torch 2.12 (pytorch/pytorch#176457 and follow-ups) handles both natively.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...registry import opaque_kind
from ..patching import Patch

__all__ = ["PATCHES"]


def make_symbolic_context(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._export.non_strict_utils._create_symbolic_context_for_tensor``
    (torch 2.11).

    Without it, ``torch.export.export(module, (subclass_with_opaque,), strict=False)``
    fails while building the input's shape context. With it, an opaque
    attribute gets no context (it has no shape) and the tensor attributes get
    theirs as before. Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    def _create_symbolic_context_for_tensor(t: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(t, torch.Tensor) and opaque_kind(t) == "reference":
            return None
        return original(t, *args, **kwargs)

    return _create_symbolic_context_for_tensor


def _is_reference_opaque(value: object) -> bool:
    from torch._library.fake_class_registry import FakeScriptObject

    return not isinstance(value, (torch.Tensor, FakeScriptObject)) and opaque_kind(value) == "reference"


def make_lift_constants_pass(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._export.passes.lift_constants_pass.lift_constants_pass``
    (torch 2.11).

    Without it, exporting a module whose graph reads a reference opaque from a
    module attribute (as after ``unwrap_tensor_subclass_parameters``) fails with
    ``AssertionError: expected int, Tensor, or FakeScriptObject key``. With it,
    each such opaque is lifted as a custom-object input like a script object
    (the pass sees a fake wrapper of the very object), and the program's
    constants hold the real object. Unnecessary since torch 2.12
    (pytorch/pytorch#176457 and follow-ups).
    """
    from .aot_autograd import fake_opaque_always

    def lift_constants_pass(gm: Any, graph_signature: Any, constant_attrs: Any) -> Any:
        swapped: dict[int, tuple[Any, Any, Any, str]] = {}
        for node in gm.graph.nodes:
            if node.op != "get_attr":
                continue
            *path, name = node.target.split(".")
            owner = gm
            for part in path:
                owner = getattr(owner, part)
            value = getattr(owner, name, None)
            if value is None or not _is_reference_opaque(value):
                continue
            fake = fake_opaque_always(value)
            setattr(owner, name, fake)
            swapped[id(fake)] = (fake, value, owner, name)
        try:
            lifted = original(gm, graph_signature, constant_attrs)
        finally:
            for fake, value, owner, name in swapped.values():
                if getattr(owner, name, None) is fake:
                    setattr(owner, name, value)
        if not swapped:
            return lifted
        return {k: swapped[id(v)][1] if id(v) in swapped and swapped[id(v)][0] is v else v for k, v in lifted.items()}

    return lift_constants_pass


def make_assign_attr(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.export.unflatten._assign_attr`` (torch 2.11), which puts
    lifted constants back on the module returned by ``ExportedProgram.module()``.

    Without it, a reference opaque among the constants fails ("expected
    torch.Tensor or torch.ScriptObject for CONSTANT attr_kind"). With it, the
    opaque is assigned at its path as a plain attribute, as torch 2.12 does
    (pytorch/pytorch#176457 and follow-ups).
    """

    def _assign_attr(from_obj: Any, to_module: torch.nn.Module, target: str, attr_kind: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_reference_opaque(from_obj) or getattr(attr_kind, "name", None) != "CONSTANT":
            return original(from_obj, to_module, target, attr_kind, *args, **kwargs)
        result = original(torch.empty(0), to_module, target, attr_kind, *args, **kwargs)
        *path, field = target.split(".")
        owner: Any = to_module
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, field, from_obj)
        return result

    return _assign_attr


PATCHES = [
    Patch(
        "torch._export.non_strict_utils._create_symbolic_context_for_tensor",
        "51ef4dde85a39546",
        make_symbolic_context,
    ),
    Patch("torch._export.passes.lift_constants_pass.lift_constants_pass", "20bbf233fd37a37e", make_lift_constants_pass),
    Patch("torch.export.unflatten._assign_attr", "364fb4f027a9f58d", make_assign_attr),
]
