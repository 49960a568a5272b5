"""Classes that torch 2.11 AOTAutograd cache entries written by opaque-subclass's
backport refer to by name.

This module sits outside the ``opaque_subclass`` package on purpose: unpickling
such an entry imports it, and it imports torch only, never ``opaque_subclass``,
whose import enables the backport. So loading an entry (by torch, or by hand in
a process that never imported the library) never patches torch. Such entries
are also keyed apart (their cache key ends in the opaques' sharing pattern), so
a process without the backport never looks them up.
"""

from __future__ import annotations

import dataclasses

from torch._functorch._aot_autograd.schemas import PlainTensorMeta

__all__ = ["OpaqueSlotMeta"]


@dataclasses.dataclass
class OpaqueSlotMeta(PlainTensorMeta):
    """torch 2.11 metadata for a flat slot holding a reference opaque.

    A ``PlainTensorMeta`` so that torch 2.11's subclass rebuilding reads the slot
    as is; never has a memory format (opaques are never coerced or
    differentiated).
    """
