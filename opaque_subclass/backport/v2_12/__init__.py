"""Fixes for torch 2.12, a native release: one module per torch area.

torch 2.12 handles opaque attributes itself (pytorch/pytorch#176457), so
nothing here provides the feature; each patch fixes an upstream bug of 2.12:
two that torch 2.13 fixed, so that the library behaves the same on both, and
the AOTAutograd cache key that ignores opaque sharing (every native release).
The set is applied all or nothing, listed in ``opaque_subclass.support().fixes`` and
removed by ``opaque_subclass.disable()``.
"""

from opaque_subclass.backport._machinery.patching import PatchSet
from opaque_subclass.backport.native import autograd_cache, diagnostics, dtensor_mesh, members

from . import export, registry

__all__ = ["FIX_SET"]

FIX_SET = PatchSet(
    [
        *registry.PATCHES,
        *export.PATCHES,
        autograd_cache.patch("b842f9aaedf60094"),
        diagnostics.wrap_tensor_patch("3e4cb5d422351e93"),
        diagnostics.symbolic_context_patch("98cb7c1802eb5fc7"),
        diagnostics.plain_tensors_patch("fed2a3a6b7209de4"),
        # members of opaques in compiled code: baked values guarded, undeclared ones named
        members.call_method_patch(members.SCRIPT_OBJECT_VARIABLE, "19c3fe3c7b0e6398"),
        members.getattr_patch(f"{members.SCRIPT_OBJECT_VARIABLE}.var_getattr", "0269dd07ee115f09"),
        dtensor_mesh.patch("b8b6040d058777ee"),  # DTensor outputs on the mesh passed in, not a cached equal one
    ]
)
