"""torch 2.12: native (pytorch/pytorch#176457), with fixes. Everything the library does on this release.

torch 2.12 handles opaque attributes itself. The library adds fixes: two bugs
that torch 2.13 fixed (``isinstance(obj, OpaqueBase)`` false for a registered
class that does not inherit it; ``ExportedProgram.module()`` and the ``.pt2``
archive dropping opaque constants: the 2.11 backport's replacements of the same
functions), and those of every native release: the AOTAutograd cache key that
ignores which inputs share one opaque, named errors at torch's entry points,
guarded member values of opaques, DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.patching import Patch
from opaque_subclass.releases.schema import OPAQUE_OBJECT_API, ReleaseSupport
from opaque_subclass.releases.shared import FOREIGN_ISINSTANCE

#: The torch source files the fingerprints below are read from, and their digests
#: (ReleaseSupport.sources): unchanged files are hashed at import, not parsed.
SOURCES = (
    # recorded on torch 2.12.0+cu130 by tools/record_sources.py: do not edit by hand
    ("<fingerprints>", "fa0f32af9c91ef7f"),
    ("_dynamo/convert_frame.py", "6ac6d2468a8471b1"),
    ("_dynamo/guards.py", "82346f2141628052"),
    ("_dynamo/variables/builder.py", "4078e9dd9b68e136"),
    ("_dynamo/variables/script_object.py", "fb1c909fba18bd41"),
    ("_export/non_strict_utils.py", "a2b044daec08a3f3"),
    ("_functorch/_aot_autograd/autograd_cache.py", "a2e517f85123a041"),
    ("_functorch/_aot_autograd/runtime_wrappers.py", "b64a44fe5afc6b5e"),
    ("_library/fake_class_registry.py", "4df93aef5bac991e"),
    ("_opaque_base.py", "df542d181832f880"),
    ("_subclasses/fake_tensor.py", "0e4139b0f63ee0a4"),
    ("export/pt2_archive/_package.py", "b306a564f3d37e53"),
    ("export/unflatten.py", "2c8eb324ceb2a6c8"),
    ("fx/experimental/proxy_tensor.py", "b5a4a7e22ff09bca"),
    ("nn/utils/parametrize.py", "56a07942c8ee1125"),
)

RELEASE = ReleaseSupport(
    (2, 12),
    "native",
    OPAQUE_OBJECT_API,
    fixes=(
        # named errors where torch first meets a subclass input (the checks: core/checks.py)
        Patch(
            "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor",
            "3e4cb5d422351e93",
            "opaque_subclass.fixes.entry_checks:make_wrap_tensor",
            caches=("torch._dynamo.variables.builder.VariableBuilder._type_dispatch_impl",),
        ),
        Patch(
            "torch._subclasses.fake_tensor.get_plain_tensors",
            "fed2a3a6b7209de4",
            "opaque_subclass.fixes.entry_checks:make_get_plain_tensors",
        ),
        Patch(
            "torch._export.non_strict_utils.fakify",
            "f03c86288f6eb35c",
            "opaque_subclass.fixes.entry_checks:make_fakify",
        ),
        # the library's errors raised while Dynamo traces reach the user as themselves
        Patch(
            "torch._dynamo.convert_frame._compile",
            "c4d18c653fdc03c0",
            "opaque_subclass.fixes.dynamo_errors:make_compile",
        ),
        # upstream bugs of this release (the replacements: opaque_subclass/fixes/)
        Patch(
            "torch._opaque_base.OpaqueBaseMeta.__instancecheck__",
            "7977294afa2786f5",
            "opaque_subclass.fixes.registry:make_instancecheck",
        ),
        Patch(
            "torch.export.unflatten._assign_attr",
            "364fb4f027a9f58d",
            "opaque_subclass.backport.export:make_assign_attr",
        ),
        Patch(
            "torch.export.pt2_archive._package._package_constants",
            "c503d4b5c778fbd4",
            "opaque_subclass.backport.archive:make_package_opaque_constants",
        ),
        Patch(
            "torch.export.pt2_archive._package._load_constants",
            "23b892b69c176401",
            "opaque_subclass.backport.archive:make_load_constants",
        ),
        Patch(
            "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key",
            "b842f9aaedf60094",
            "opaque_subclass.fixes.autograd_cache:make_autograd_cache_key",
        ),
        Patch(
            "torch._dynamo.variables.script_object.TorchScriptObjectVariable.call_method",
            "19c3fe3c7b0e6398",
            "opaque_subclass.fixes.members:make_call_method",
        ),
        Patch(
            "torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr",
            "0269dd07ee115f09",
            "opaque_subclass.fixes.members:make_getattr",
        ),
        Patch(
            "torch.fx.experimental.proxy_tensor.get_proxy_slot",
            "b8b6040d058777ee",
            "opaque_subclass.fixes.dtensor_mesh:make_get_proxy_slot",
        ),
        # a tangent whose attribute list is not its output's: a named error, never read at the
        # output's names (opaque_subclass/fixes/tangent_attributes.py)
        Patch(
            "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent",
            "ee996c364af9896c",
            "opaque_subclass.fixes.tangent_attributes:make_process_runtime_tangent",
        ),
        # an opaque whose __getattr__ answers every name is not a TorchScript object
        # (opaque_subclass/fixes/opaque_protocols.py)
        Patch(
            "torch._library.fake_class_registry.tracing_with_real",
            "616fbc9b9bcfb85a",
            "opaque_subclass.fixes.opaque_protocols:make_tracing_with_real",
        ),
        # an opaque leaf deleted from a parametrization: a named error, not the property reported
        # missing (opaque_subclass/fixes/parametrize_originals.py)
        Patch(
            "torch.nn.utils.parametrize.ParametrizationList.forward",
            "59226a39f4519094",
            "opaque_subclass.fixes.parametrize_originals:make_forward",
        ),
        # a DeviceMesh guarded on its rank map only when the program read it: one compilation per
        # mesh shape (opaque_subclass/fixes/mesh_guards.py)
        Patch(
            "torch._dynamo.guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",
            "ce589a5f6d7eb104",
            "opaque_subclass.fixes.mesh_guards:make_opaque_guard",
        ),
        Patch(
            "torch._library.fake_class_registry.FakeScriptObject.__getattribute__",
            "765589c7fad5ec5c",
            "opaque_subclass.fixes.below_dynamo:make_fake_object_getattribute",
        ),
    ),
    limits=(
        FOREIGN_ISINSTANCE,
        "torch 2.12's CUDA build without a GPU may abort at interpreter exit ('terminate called "
        "without an active exception', exit 134) after threads that compiled have exited, with or "
        "without the library (4 of 6 runs of a 3-thread program): compile from one long-lived thread",
    ),
    sources=SOURCES,
)
