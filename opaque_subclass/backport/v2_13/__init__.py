"""Fixes for torch 2.13, a native release.

The AOTAutograd cache key ignores which inputs share one opaque (see
:mod:`opaque_subclass.backport.native.autograd_cache`). Applied all or
nothing, listed in ``opaque_subclass.support().fixes``, removed by
``opaque_subclass.disable()``.
"""

from ..native import autograd_cache
from ..patching import PatchSet

__all__ = ["FIX_SET"]

FIX_SET = PatchSet(
    [autograd_cache.patch("746e13724b1aa10b")]
)
