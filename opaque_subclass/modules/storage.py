"""Storage accounting for subclasses with opaque attributes.

Memory tools count a tensor by the untyped storages behind it. A wrapper
subclass has no storage of its own: its storages are those of its inner
tensors, nested subclasses walked, opaques skipped (they hold no tensor
memory that belongs to this tensor).
"""

from __future__ import annotations

import torch

from opaque_subclass.core.errors import OpaqueTypeError, describe_type
from opaque_subclass.core.flatten import append_leaves, is_wrapper_subclass

__all__ = ["untyped_storages"]


def untyped_storages(t: torch.Tensor) -> set[torch.UntypedStorage]:
    """The untyped storages of ``t``: its own for a plain tensor, its inner
    tensors' (recursively) for a wrapper subclass; opaque attributes are skipped.

    Parameters
    ----------
    t
        A tensor, plain or a (nested) wrapper subclass.
    """
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
