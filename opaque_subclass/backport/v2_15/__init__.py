"""Fixes for torch 2.15, a native release: torch 2.14's fixes (its partitioner
still calls the deprecated ``is_opaque_value``, unchanged), and the AOTAutograd
cache-key fix written against 2.15's own ``autograd_cache_key``."""

from opaque_subclass.backport._machinery.patching import PatchSet
from opaque_subclass.backport.native import autograd_cache, diagnostics, dtensor_mesh, members
from opaque_subclass.backport.v2_14 import aot_autograd

__all__ = ["FIX_SET"]

FIX_SET = PatchSet(
    [
        *aot_autograd.PATCHES,
        autograd_cache.patch("26aa5a210e4eaa85"),
        diagnostics.wrap_tensor_patch("3f917c5075df5856"),
        diagnostics.symbolic_context_patch("20b9804df638b119"),
        diagnostics.plain_tensors_patch("7778f151d889482b"),
        # members of opaques in compiled code: baked values guarded, undeclared ones named
        members.call_method_patch(members.CUSTOM_CLASS_VARIABLE, "3c566bf785884072"),
        members.getattr_patch(f"{members.CUSTOM_CLASS_VARIABLE}.tp_getattro_impl", "d5c65463ec052981"),
        dtensor_mesh.patch("05a9f0bd25707a04"),  # DTensor outputs on the mesh passed in, not a cached equal one
    ]
)
