"""Fixes for torch 2.14 and 2.15, native releases: one module per torch area.

torch 2.14 renamed opaque objects to "custom classes" and made every use of
the old names log a deprecation warning, but left one of its own call sites on
an old name. The library hides that rename from its users, torch's own
leftovers included. Applied all or nothing, listed in
``opaque_subclass.support().fixes``, removed by ``opaque_subclass.disable()``.
"""

from ..patching import PatchSet
from . import aot_autograd

__all__ = ["FIX_SET"]

FIX_SET = PatchSet([*aot_autograd.PATCHES], preload=("torch._functorch.partitioners",))
