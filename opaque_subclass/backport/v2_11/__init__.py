"""The patch set for torch 2.11: one module per torch area."""

from opaque_subclass.backport._machinery.patching import PatchSet
from opaque_subclass.backport.native import diagnostics, members

from . import aot_autograd, archive, collectives, distributed, dtensor, dynamo, export, fake, parametrize, runtime

__all__ = ["PATCH_SET"]

PATCH_SET = PatchSet(
    [
        *fake.PATCHES,
        *dynamo.PATCHES,
        *aot_autograd.PATCHES,
        *runtime.PATCHES,
        *export.PATCHES,
        *archive.PATCHES,
        *parametrize.PATCHES,
        *distributed.PATCHES,
        *collectives.PATCHES,
        # torch's plain-tensor walk, as on the native releases: named errors for
        # malformed flatten results under non-strict torch.export
        diagnostics.plain_tensors_patch("4e95507881e5f3a0"),
        # members of opaques in compiled code: baked values guarded, undeclared ones named
        members.call_method_patch(members.SCRIPT_OBJECT_VARIABLE, "55c82a3f6ed68f2e"),
        # ... and, on 2.11, an opaque's truthiness (``group or WORLD`` in torch's collectives)
        collectives.getattr_patch(),
        *dtensor.PATCHES,
    ]
)
