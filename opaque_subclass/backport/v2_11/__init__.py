"""The patch set for torch 2.11: one module per torch area."""

from ..patching import PatchSet
from . import aot_autograd, distributed, dynamo, export, fake, parametrize, runtime

__all__ = ["PATCH_SET"]

#: torch modules imported before patching, so that every module that imports a
#: patched function by name already holds it (and gets the replacement).
PRELOAD = (
    "torch._subclasses.fake_tensor",
    "torch._subclasses.meta_utils",
    "torch._functorch.aot_autograd",
    "torch._functorch._aot_autograd.runtime_wrappers",
    "torch._functorch._aot_autograd.graph_capture_wrappers",
    "torch._functorch._aot_autograd.collect_metadata_analysis",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._dynamo.variables.builder",
    "torch._dynamo.output_graph",
    "torch._dynamo.guards",
    "torch.fx.experimental.symbolic_shapes",
    "torch.nn.utils.parametrize",
    "torch._functorch._aot_autograd.subclass_parametrization",
    "torch._export.non_strict_utils",
    "torch._export.passes.lift_constants_pass",
    "torch.export._trace",
    "torch._dynamo.convert_frame",
    "torch._dynamo.functional_export",
    "torch.export._unlift",
    "torch.export.unflatten",
    "torch.distributed.fsdp._init_utils",
    "torch.distributed._tools.common_utils",
    "torch.distributed._tools.mem_tracker",
    "torch.distributed._tools.sac_estimator",
)

PATCH_SET = PatchSet(
    [*fake.PATCHES, *dynamo.PATCHES, *aot_autograd.PATCHES, *runtime.PATCHES, *export.PATCHES, *parametrize.PATCHES, *distributed.PATCHES],
    preload=PRELOAD,
)
