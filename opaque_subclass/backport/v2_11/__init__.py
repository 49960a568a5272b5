"""The patch set for torch 2.11: one module per torch area."""

from opaque_subclass.backport._machinery.patching import PatchSet

from . import aot_autograd, archive, distributed, dynamo, export, fake, parametrize, runtime

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
    ]
)
