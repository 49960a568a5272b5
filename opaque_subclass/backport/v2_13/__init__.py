"""Fixes for torch 2.13, a native release.

The AOTAutograd cache key ignores which inputs share one opaque (see
:mod:`opaque_subclass.backport.native.autograd_cache`). Applied all or
nothing, listed in ``opaque_subclass.support().fixes``, removed by
``opaque_subclass.disable()``.
"""

from opaque_subclass.backport._machinery.patching import PatchSet
from opaque_subclass.backport.native import autograd_cache, diagnostics, dtensor_mesh, members

__all__ = ["FIX_SET"]

FIX_SET = PatchSet(
    [
        autograd_cache.patch("746e13724b1aa10b"),
        diagnostics.wrap_tensor_patch("4d0013f630d40596"),
        diagnostics.symbolic_context_patch("98cb7c1802eb5fc7"),
        diagnostics.plain_tensors_patch("9c9324c1b64f0c1b"),
        # members of opaques in compiled code: baked values guarded, undeclared ones named
        members.call_method_patch(members.SCRIPT_OBJECT_VARIABLE, "9caba592748686d4"),
        members.getattr_patch(f"{members.SCRIPT_OBJECT_VARIABLE}.var_getattr", "10aa958cf597b072"),
        dtensor_mesh.patch("b8b6040d058777ee"),  # DTensor outputs on the mesh passed in, not a cached equal one
    ]
)
