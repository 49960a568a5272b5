"""Storage accounting for subclasses with opaque attributes.

Memory tools count a tensor by its untyped storages; a wrapper subclass's are
its inner tensors' (nesting walked, opaques skipped: they hold none of its memory).
"""

from __future__ import annotations

import torch

from opaque_subclass.core.errors import OpaqueTypeError, describe_type
from opaque_subclass.core.flatten import append_leaves, is_wrapper_subclass

__all__ = ["untyped_storages"]


def untyped_storages(t: torch.Tensor) -> set[torch.UntypedStorage]:
    """The untyped storages of ``t``: its own for a plain tensor, its inner
    tensors' (recursively) for a wrapper subclass; opaque attributes are skipped."""
    if not isinstance(t, torch.Tensor):
        raise OpaqueTypeError(
            f"untyped_storages expects a tensor, got {describe_type(t)}. Fix: pass the "
            "tensor (or subclass instance) whose memory you want to count."
        )
    if not is_wrapper_subclass(t):
        return {t.untyped_storage()}
    leaves: list[object] = []
    append_leaves(t, leaves, "t")
    return {leaf.untyped_storage() for leaf in leaves if isinstance(leaf, torch.Tensor)}
