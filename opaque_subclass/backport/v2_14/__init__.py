"""Fixes for torch 2.14, a native release: one module per torch area.

The AOTAutograd cache key ignores which inputs share one opaque (see
:mod:`opaque_subclass.backport.native.autograd_cache`). And torch 2.14
renamed opaque objects to "custom classes" and made every use of the old
names log a deprecation warning, but left one of its own call sites on an old
name. The library hides that rename from its users, torch's own
leftovers included. Applied all or nothing, listed in
``opaque_subclass.support().fixes``, removed by ``opaque_subclass.disable()``.
"""

from opaque_subclass.backport._machinery.patching import PatchSet
from opaque_subclass.backport.native import autograd_cache, diagnostics, dtensor_mesh, members

from . import aot_autograd

__all__ = ["FIX_SET"]


FIX_SET = PatchSet(
    [
        *aot_autograd.PATCHES,
        autograd_cache.patch("ec0906f362c21ef6"),
        diagnostics.wrap_tensor_patch("3f917c5075df5856"),
        diagnostics.symbolic_context_patch("342a3851b99d5c47"),
        diagnostics.plain_tensors_patch("7778f151d889482b"),
        # members of opaques in compiled code: baked values guarded, undeclared ones named
        members.call_method_patch(members.CUSTOM_CLASS_VARIABLE, "3c566bf785884072"),
        members.getattr_patch(f"{members.CUSTOM_CLASS_VARIABLE}.tp_getattro_impl", "ca3de2aa2afad6b1"),
        dtensor_mesh.patch("05a9f0bd25707a04"),  # DTensor outputs on the mesh passed in, not a cached equal one
    ]
)
