"""torch 2.13: native, with fixes. Everything the library does on this release.

The fixes of every native release: the AOTAutograd cache key that ignores
which inputs share one opaque, named errors at torch's entry points, guarded
member values of opaques, DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.patching import Patch
from opaque_subclass.releases.schema import OPAQUE_OBJECT_API, ReleaseSupport
from opaque_subclass.releases.shared import FOREIGN_ISINSTANCE

#: The torch source files the fingerprints below are read from, and their digests
#: (ReleaseSupport.sources): unchanged files are hashed at import, not parsed.
SOURCES = (
    # recorded on torch 2.13.0+cpu by tools/record_sources.py: do not edit by hand
    ("<fingerprints>", "43129aada8356f63"),
    ("_dynamo/convert_frame.py", "ca21a952feec8255"),
    ("_dynamo/guards.py", "882940c8d52d7e16"),
    ("_dynamo/variables/builder.py", "d05d046e77ed7fab"),
    ("_dynamo/variables/script_object.py", "6df0ec30283d4dee"),
    ("_export/non_strict_utils.py", "ffed1b37d143a2b1"),
    ("_functorch/_aot_autograd/autograd_cache.py", "c8581bdaa75922e3"),
    ("_functorch/_aot_autograd/runtime_wrappers.py", "efa73da320f9df6f"),
    ("_library/fake_class_registry.py", "14f12e8d9fec7e90"),
    ("_subclasses/fake_tensor.py", "72a5c601389be918"),
    ("fx/experimental/proxy_tensor.py", "be14c189319501fc"),
    ("nn/utils/parametrize.py", "56a07942c8ee1125"),
)

RELEASE = ReleaseSupport(
    (2, 13),
    "native",
    OPAQUE_OBJECT_API,
    fixes=(
        # named errors where torch first meets a subclass input (the checks: core/checks.py)
        Patch(
            "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor",
            "4d0013f630d40596",
            "opaque_subclass.fixes.entry_checks:make_wrap_tensor",
            caches=("torch._dynamo.variables.builder.VariableBuilder._type_dispatch_impl",),
        ),
        Patch(
            "torch._subclasses.fake_tensor.get_plain_tensors",
            "9c9324c1b64f0c1b",
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
            "ee899920ed150460",
            "opaque_subclass.fixes.dynamo_errors:make_compile",
        ),
        # upstream bugs of this release (the replacements: opaque_subclass/fixes/)
        Patch(
            "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key",
            "746e13724b1aa10b",
            "opaque_subclass.fixes.autograd_cache:make_autograd_cache_key",
        ),
        Patch(
            "torch._dynamo.variables.script_object.TorchScriptObjectVariable.call_method",
            "9caba592748686d4",
            "opaque_subclass.fixes.members:make_call_method",
        ),
        Patch(
            "torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr",
            "10aa958cf597b072",
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
    limits=(FOREIGN_ISINSTANCE,),
    sources=SOURCES,
)
