"""torch 2.14: native, with fixes. Everything the library does on this release.

torch 2.14 renamed opaque objects to "custom classes" (``register_custom_class``,
``typ="symbolic" | "constant"``) and logs a deprecation for every use of the
old names; the library calls the new ones, and fixes torch's partitioner,
which still calls the deprecated ``is_opaque_value``. Then the fixes of every
native release: the AOTAutograd cache key that ignores which inputs share one
opaque, named errors at torch's entry points, guarded member values of
opaques, DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.patching import Patch
from opaque_subclass.releases.schema import CUSTOM_CLASS_API, ReleaseSupport
from opaque_subclass.releases.shared import FOREIGN_ISINSTANCE

#: The torch source files the fingerprints below are read from, and their digests
#: (ReleaseSupport.sources): unchanged files are hashed at import, not parsed.
SOURCES = (
    # recorded on torch 2.14.1+cu130 by tools/record_sources.py: do not edit by hand
    ("<fingerprints>", "951110ff47b520d4"),
    ("_dynamo/convert_frame.py", "b453c9d88aae46cf"),
    ("_dynamo/guards.py", "3ec7dc00edbf6156"),
    ("_dynamo/variables/builder.py", "900e23d3fad56363"),
    ("_dynamo/variables/script_object.py", "3894339cc3431945"),
    ("_export/non_strict_utils.py", "a61b9fa9a90bbac9"),
    ("_functorch/_aot_autograd/autograd_cache.py", "8f8357618ef656dd"),
    ("_functorch/_aot_autograd/runtime_wrappers.py", "d787a15203c68b53"),
    ("_functorch/partitioners.py", "42a65410420df44a"),
    ("_library/fake_class_registry.py", "60e1d5b41c996373"),
    ("_library/opaque_object.py", "f3e0d89aba24d326"),
    ("_subclasses/fake_tensor.py", "a650411e6a7adde3"),
    ("fx/experimental/proxy_tensor.py", "ac78e70429eac827"),
    ("nn/utils/parametrize.py", "69723f1ba493954e"),
)

RELEASE = ReleaseSupport(
    (2, 14),
    "native",
    CUSTOM_CLASS_API,
    fixes=(
        # named errors where torch first meets a subclass input (the checks: core/checks.py)
        Patch(
            "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor",
            "3f917c5075df5856",
            "opaque_subclass.fixes.entry_checks:make_wrap_tensor",
            caches=("torch._dynamo.variables.builder.VariableBuilder._type_dispatch_impl",),
        ),
        Patch(
            "torch._subclasses.fake_tensor.get_plain_tensors",
            "7778f151d889482b",
            "opaque_subclass.fixes.entry_checks:make_get_plain_tensors",
        ),
        Patch(
            "torch._export.non_strict_utils.fakify",
            "a5b3fb134dc1ae41",
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
            "torch._functorch.partitioners.is_opaque_value",
            "4a335e63a783a6ea",
            "opaque_subclass.fixes.partitioner:make_partitioner_is_opaque_value",
            depends_on=(("torch._library.opaque_object.is_custom_class_obj", "81ead463b8a301a8"),),
            scope="here",
        ),
        Patch(
            "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key",
            "ec0906f362c21ef6",
            "opaque_subclass.fixes.autograd_cache:make_autograd_cache_key",
        ),
        Patch(
            "torch._dynamo.variables.script_object.CustomClassObjectVariable.call_method",
            "3c566bf785884072",
            "opaque_subclass.fixes.members:make_call_method",
        ),
        Patch(
            "torch._dynamo.variables.script_object.CustomClassObjectVariable.tp_getattro_impl",
            "ca3de2aa2afad6b1",
            "opaque_subclass.fixes.members:make_getattr",
        ),
        Patch(
            "torch.fx.experimental.proxy_tensor.get_proxy_slot",
            "05a9f0bd25707a04",
            "opaque_subclass.fixes.dtensor_mesh:make_get_proxy_slot",
        ),
        # a tangent whose attribute list is not its output's: a named error, never read at the
        # output's names (opaque_subclass/fixes/tangent_attributes.py)
        Patch(
            "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent",
            "588b9ced7da98b54",
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
            "cb54e6ae28a93091",
            "opaque_subclass.fixes.mesh_guards:make_opaque_guard",
        ),
        Patch(
            "torch._library.fake_class_registry.FakeScriptObject.__getattribute__",
            "69c7eeaeeb47cd95",
            "opaque_subclass.fixes.below_dynamo:make_fake_object_getattribute",
        ),
    ),
    limits=(FOREIGN_ISINSTANCE,),
    sources=SOURCES,
)
