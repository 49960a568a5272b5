"""``torch.export`` (non-strict) with subclass inputs holding opaques (torch 2.11).

Non-strict export builds a symbolic (shape) context for every input tensor and
for every attribute its ``__tensor_flatten__`` names. torch 2.11 treats an
opaque attribute as a tensor there and fails (``'Mesh' object has no attribute
'shape'``); torch 2.12 (pytorch/pytorch#176457) skips opaques.
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


PATCHES = [
    Patch(
        "torch._export.non_strict_utils._create_symbolic_context_for_tensor",
        "51ef4dde85a39546",
        make_symbolic_context,
    ),
]
