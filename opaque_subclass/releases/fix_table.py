"""The fixes the library installs on several releases, each written once.

A fix replaces one torch function on every release listed in its row, with one
factory (``opaque_subclass/fixes/``, or a backport module whose replacement a
native release needs too) and that release's fingerprint of the function's
source; the function may have another name on some releases (torch 2.14 renamed
``TorchScriptObjectVariable``). ``fix_rows((2, 13))`` is what a release module
lists as its fixes, in this table's order: "what runs on torch 2.13" stays one
view, ``opaque_subclass.releases.RELEASES[(2, 13)].fixes`` (``python -m
opaque_subclass`` prints it, docs/compatibility.md is generated from it). On
torch 2.11 the rows that list it join the backport's patch set.

Adding a fix: a row here with the releases it applies to and each one's
fingerprint (``python -c "from opaque_subclass.patching import fingerprint; ..."``),
then ``python tools/record_sources.py`` on each of those releases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from opaque_subclass.patching import Patch

__all__ = ["FIXES", "Fix", "fix_rows"]

Release = tuple[int, int]


@dataclass(frozen=True)
class Fix:
    """One fix: where its factory lives, the torch function it replaces, and the
    fingerprint of that function on each release it applies to.

    Attributes
    ----------
    make
        ``"package.module:make_<name>"``, the replacement's factory.
    target
        The replaced function's qualified name (on a release listed in
        ``targets``, that one's name instead).
    fingerprints
        Release -> fingerprint of the function's source there: the releases the
        fix applies to.
    targets
        Releases whose function has another qualified name.
    caches, depends_on, scope
        As :class:`~opaque_subclass.patching.Patch`'s, the same on every release.
    """

    make: str
    target: str
    fingerprints: Mapping[Release, str]
    targets: Mapping[Release, str] = field(default_factory=dict)
    caches: tuple[str, ...] = ()
    depends_on: tuple[tuple[str, str], ...] = ()
    scope: Literal["everywhere", "here"] = "everywhere"

    def row(self, release: Release) -> Patch:
        """The release's row: a :class:`~opaque_subclass.patching.Patch`."""
        return Patch(
            self.targets.get(release, self.target),
            self.fingerprints[release],
            self.make,
            depends_on=self.depends_on,
            scope=self.scope,
            caches=self.caches,
        )


FIXES: tuple[Fix, ...] = (
    # named errors where torch first meets a subclass input (the checks: core/checks.py)
    Fix(
        "opaque_subclass.fixes.entry_checks:make_wrap_tensor",
        "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor",
        {
            (2, 12): "3e4cb5d422351e93",
            (2, 13): "4d0013f630d40596",
            (2, 14): "3f917c5075df5856",
            (2, 15): "3f917c5075df5856",
        },
        caches=("torch._dynamo.variables.builder.VariableBuilder._type_dispatch_impl",),
    ),
    Fix(
        "opaque_subclass.fixes.entry_checks:make_get_plain_tensors",
        "torch._subclasses.fake_tensor.get_plain_tensors",
        {
            (2, 11): "4e95507881e5f3a0",
            (2, 12): "fed2a3a6b7209de4",
            (2, 13): "9c9324c1b64f0c1b",
            (2, 14): "7778f151d889482b",
            (2, 15): "7778f151d889482b",
        },
    ),
    Fix(
        "opaque_subclass.fixes.entry_checks:make_fakify",
        "torch._export.non_strict_utils.fakify",
        {
            (2, 11): "5ba92b774b15663c",
            (2, 12): "f03c86288f6eb35c",
            (2, 13): "f03c86288f6eb35c",
            (2, 14): "a5b3fb134dc1ae41",
            (2, 15): "a5b3fb134dc1ae41",
        },
    ),
    # the library's errors raised while Dynamo traces reach the user as themselves
    Fix(
        "opaque_subclass.fixes.dynamo_errors:make_compile",
        "torch._dynamo.convert_frame._compile",
        {
            (2, 11): "dfa174bce2ffdec4",
            (2, 12): "c4d18c653fdc03c0",
            (2, 13): "ee899920ed150460",
            (2, 14): "ee899920ed150460",
            (2, 15): "8041208bb845db0c",
        },
    ),
    # the partitioner asks torch 2.14's new name, without the deprecation log
    Fix(
        "opaque_subclass.fixes.partitioner:make_partitioner_is_opaque_value",
        "torch._functorch.partitioners.is_opaque_value",
        {(2, 14): "4a335e63a783a6ea", (2, 15): "4a335e63a783a6ea"},
        depends_on=(("torch._library.opaque_object.is_custom_class_obj", "81ead463b8a301a8"),),
        scope="here",
    ),
    # upstream bugs of a release (the replacements: opaque_subclass/fixes/, and 2.12's export
    # fixes shared with the 2.11 backport)
    Fix(
        "opaque_subclass.fixes.registry:make_instancecheck",
        "torch._opaque_base.OpaqueBaseMeta.__instancecheck__",
        {(2, 12): "7977294afa2786f5"},
    ),
    Fix(
        "opaque_subclass.backport.export:make_assign_attr",
        "torch.export.unflatten._assign_attr",
        {(2, 12): "364fb4f027a9f58d"},
    ),
    Fix(
        "opaque_subclass.backport.archive:make_package_opaque_constants",
        "torch.export.pt2_archive._package._package_constants",
        {(2, 12): "c503d4b5c778fbd4"},
    ),
    Fix(
        "opaque_subclass.backport.archive:make_load_constants",
        "torch.export.pt2_archive._package._load_constants",
        {(2, 12): "23b892b69c176401"},
    ),
    # AOTAutograd's cache key covers which inputs share one opaque
    Fix(
        "opaque_subclass.fixes.autograd_cache:make_autograd_cache_key",
        "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key",
        {
            (2, 12): "b842f9aaedf60094",
            (2, 13): "746e13724b1aa10b",
            (2, 14): "ec0906f362c21ef6",
            (2, 15): "26aa5a210e4eaa85",
        },
    ),
    # AOTAutograd's cacheability check reads a graph's subgraphs too when its inputs hold an
    # opaque: a function Dynamo does not trace, inside a checkpointed region, is not served stale
    # (pytorch/pytorch#194658, open upstream; fixes/autograd_cache.py)
    Fix(
        "opaque_subclass.fixes.autograd_cache:make_check_cacheable",
        "torch._functorch._aot_autograd.autograd_cache.check_cacheable",
        {
            (2, 11): "3048741c0aaaf05e",
            (2, 12): "3048741c0aaaf05e",
            (2, 13): "8d450e0c7566ff16",
            (2, 14): "8d450e0c7566ff16",
            (2, 15): "8d450e0c7566ff16",
        },
    ),
    # an AOTAutograd cache entry whose graph names a process group is served only where the name
    # means the same group, with this rank in it (fixes/group_entries.py): saved with the record,
    # checked as the first of the entry's guards
    Fix(
        "opaque_subclass.fixes.group_entries:make_cache_save",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.save",
        {
            (2, 11): "78014c5dadb49828",
            (2, 12): "c607fdf6f6804220",
            (2, 13): "f762e9ec5cb0d181",
            (2, 14): "f762e9ec5cb0d181",
            (2, 15): "f360a65355fb2a05",
        },
    ),
    Fix(
        "opaque_subclass.fixes.group_entries:make_evaluate_guards",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.evaluate_guards",
        {
            (2, 11): "e685e1b4db030d2c",
            (2, 12): "e685e1b4db030d2c",
            (2, 13): "e685e1b4db030d2c",
            (2, 14): "e685e1b4db030d2c",
            (2, 15): "e685e1b4db030d2c",
        },
    ),
    # sets in a hand-written subclass's flatten context key the AOTAutograd cache alike in every
    # process (pytorch/pytorch#193418, fixed in torch 2.15; fixes/set_metadata.py)
    Fix(
        "opaque_subclass.fixes.set_metadata:make_default_stable_hash",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCachePickler._default_stable_hash_for_caching",
        {
            (2, 12): "64a88b7d28953ca2",
            (2, 13): "9b2c18991f497c62",
            (2, 14): "9b2c18991f497c62",
        },
    ),
    # a value opaque beside a subclass stays a constant of the graph, not torch's fake wrapper
    # (pytorch/pytorch#193190, fixed in torch 2.15; fixes/value_outputs.py)
    Fix(
        "opaque_subclass.fixes.value_outputs:make_unwrap_tensor_subclasses",
        "torch._functorch._aot_autograd.subclass_utils.unwrap_tensor_subclasses",
        {
            (2, 12): "f395de8ec079cf2e",
            (2, 13): "f395de8ec079cf2e",
            (2, 14): "7fc1ad2aed19d225",
        },
    ),
    # a reference opaque made while torch traces, about to be compiled in as a constant shared by
    # every call: a named error (pytorch/pytorch#176044; fixes/traced_opaques.py). The metaclass
    # records what is made while a tracer is active, the tracer refuses it.
    Fix(
        "opaque_subclass.fixes.traced_opaques:make_metaclass_call",
        "torch._opaque_base.OpaqueBaseMeta.__call__",
        {
            (2, 11): "6e55a720a260c8b9",
            (2, 12): "957c2bcd4b456c41",
            (2, 13): "254c60e78e476733",
            (2, 14): "729c67bd71741eb6",
            (2, 15): "729c67bd71741eb6",
        },
        targets={
            (2, 14): "torch._custom_class_base.CustomClassBaseMeta.__call__",
            (2, 15): "torch._custom_class_base.CustomClassBaseMeta.__call__",
        },
    ),
    Fix(
        "opaque_subclass.fixes.traced_opaques:make_create_arg",
        "torch.fx.experimental.proxy_tensor.PythonKeyTracer.create_arg",
        {
            (2, 11): "8c4f80b12bc187da",
            (2, 12): "c90c85935675c922",
            (2, 13): "c90c85935675c922",
            (2, 14): "1d30f068379213a6",
            (2, 15): "1d30f068379213a6",
        },
    ),
    # a callable value opaque read off a subclass tensor made in the compiled region is a constant,
    # not a graph break (pytorch/pytorch#188796, fixed in torch 2.15; fixes/callable_values.py)
    Fix(
        "opaque_subclass.fixes.callable_values:make_dynamic_getattr",
        "torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr",
        {
            (2, 12): "4ed66bcafa1eb1ee",
            (2, 13): "77feddea6b6e578e",
            (2, 14): "63011ce542e0a14d",
        },
    ),
    # members of opaques in compiled code: baked values guarded, undeclared ones named
    Fix(
        "opaque_subclass.fixes.members:make_call_method",
        "torch._dynamo.variables.script_object.TorchScriptObjectVariable.call_method",
        {
            (2, 11): "55c82a3f6ed68f2e",
            (2, 12): "19c3fe3c7b0e6398",
            (2, 13): "9caba592748686d4",
            (2, 14): "3c566bf785884072",
            (2, 15): "3c566bf785884072",
        },
        targets={
            (2, 14): "torch._dynamo.variables.script_object.CustomClassObjectVariable.call_method",
            (2, 15): "torch._dynamo.variables.script_object.CustomClassObjectVariable.call_method",
        },
    ),
    Fix(
        "opaque_subclass.fixes.members:make_getattr",
        "torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr",
        {
            (2, 12): "0269dd07ee115f09",
            (2, 13): "10aa958cf597b072",
            (2, 14): "ca3de2aa2afad6b1",
            (2, 15): "d5c65463ec052981",
        },
        targets={
            (2, 14): "torch._dynamo.variables.script_object.CustomClassObjectVariable.tp_getattro_impl",
            (2, 15): "torch._dynamo.variables.script_object.CustomClassObjectVariable.tp_getattro_impl",
        },
    ),
    # DTensor outputs on the mesh passed in (fixes/dtensor_mesh.py)
    Fix(
        "opaque_subclass.fixes.dtensor_mesh:make_get_proxy_slot",
        "torch.fx.experimental.proxy_tensor.get_proxy_slot",
        {
            (2, 12): "b8b6040d058777ee",
            (2, 13): "b8b6040d058777ee",
            (2, 14): "05a9f0bd25707a04",
            (2, 15): "05a9f0bd25707a04",
        },
    ),
    # a tangent whose attribute list is not its output's: a named error, never read at the
    # output's names (fixes/tangent_attributes.py)
    Fix(
        "opaque_subclass.fixes.tangent_attributes:make_process_runtime_tangent",
        "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent",
        {
            (2, 11): "5b1a84a4b295c1c8",
            (2, 12): "ee996c364af9896c",
            (2, 13): "ee996c364af9896c",
            (2, 14): "588b9ced7da98b54",
            (2, 15): "6a2d0fab7e268275",
        },
    ),
    # the opaques a compiled forward saves for its backward: each class's registration asked of
    # torch once per registry entry, not on every call (fixes/saved_opaques.py)
    Fix(
        "opaque_subclass.fixes.saved_opaques:make_saved_opaque_check",
        "torch._functorch._aot_autograd.runtime_wrappers.is_opaque_type",
        {
            (2, 11): "f1cd423de47c0745",
            (2, 12): "17232ee3d9b0830d",
            (2, 13): "17232ee3d9b0830d",
            (2, 14): "0dffe3f087969f3f",
            (2, 15): "0dffe3f087969f3f",
        },
        targets={
            (2, 14): "torch._functorch._aot_autograd.runtime_wrappers.is_custom_class",
            (2, 15): "torch._functorch._aot_autograd.runtime_wrappers.is_custom_class",
        },
        scope="here",
    ),
    # an opaque whose __getattr__ answers every name is not a TorchScript object
    # (fixes/opaque_protocols.py)
    Fix(
        "opaque_subclass.fixes.opaque_protocols:make_tracing_with_real",
        "torch._library.fake_class_registry.tracing_with_real",
        {
            (2, 11): "616fbc9b9bcfb85a",
            (2, 12): "616fbc9b9bcfb85a",
            (2, 13): "616fbc9b9bcfb85a",
            (2, 14): "616fbc9b9bcfb85a",
            (2, 15): "616fbc9b9bcfb85a",
        },
    ),
    # an opaque leaf deleted from a parametrization: a named error, not the property reported
    # missing (fixes/parametrize_originals.py)
    Fix(
        "opaque_subclass.fixes.parametrize_originals:make_forward",
        "torch.nn.utils.parametrize.ParametrizationList.forward",
        {
            (2, 11): "59226a39f4519094",
            (2, 12): "59226a39f4519094",
            (2, 13): "59226a39f4519094",
            (2, 14): "59226a39f4519094",
            (2, 15): "59226a39f4519094",
        },
    ),
    # a subclass whose flatten is the same for every instance: its two per-input Python guards
    # replaced by one check of the class per call (fixes/subclass_guards.py)
    Fix(
        "opaque_subclass.fixes.subclass_guards:make_metadata_guard",
        "torch._dynamo.guards.GuardBuilder.TENSOR_SUBCLASS_METADATA_MATCH",
        {
            (2, 11): "2f5a1f14a19ffeeb",
            (2, 12): "08c09d28ed1aec06",
            (2, 13): "08c09d28ed1aec06",
            (2, 14): "feb489c5004f7eb9",
            (2, 15): "feb489c5004f7eb9",
        },
    ),
    Fix(
        "opaque_subclass.fixes.subclass_guards:make_attr_list_guard",
        "torch._dynamo.guards.GuardBuilder.EQUALS_MATCH",
        {
            (2, 11): "3bc7b7dddaf9e1b9",
            (2, 12): "f082768b6d057ad1",
            (2, 13): "eac44986999eacf5",
            (2, 14): "f5ff7ef645acac99",
            (2, 15): "d495a9e93d956fc0",
        },
    ),
    # a DeviceMesh guarded on its rank map only when the program read it: one compilation per
    # mesh shape (fixes/mesh_guards.py)
    Fix(
        "opaque_subclass.fixes.mesh_guards:make_opaque_guard",
        "torch._dynamo.guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH",
        {
            (2, 11): "7ddb4420a2dd7a39",
            (2, 12): "ce589a5f6d7eb104",
            (2, 13): "ce589a5f6d7eb104",
            (2, 14): "cb54e6ae28a93091",
            (2, 15): "cb54e6ae28a93091",
        },
    ),
    # what compiled code reads of an opaque below Dynamo, recorded (fixes/below_dynamo.py)
    Fix(
        "opaque_subclass.fixes.below_dynamo:make_fake_object_getattribute",
        "torch._library.fake_class_registry.FakeScriptObject.__getattribute__",
        {
            (2, 12): "765589c7fad5ec5c",
            (2, 13): "765589c7fad5ec5c",
            (2, 14): "69c7eeaeeb47cd95",
            (2, 15): "69c7eeaeeb47cd95",
        },
    ),
    # the use of this rank's position read from a real DeviceMesh below Dynamo, recorded while
    # compilations are shared across ranks (fixes/below_dynamo.py)
    Fix(
        "opaque_subclass.fixes.below_dynamo:make_sym_get_coordinate",
        "torch.distributed.device_mesh.DeviceMesh._sym_get_coordinate",
        {
            (2, 12): "8533ccdd7561f449",
            (2, 13): "8533ccdd7561f449",
            (2, 14): "86e324dfbc91b5ee",
            (2, 15): "86e324dfbc91b5ee",
        },
    ),
    Fix(
        "opaque_subclass.fixes.below_dynamo:make_get_coordinate",
        "torch.distributed.device_mesh.DeviceMesh.get_coordinate",
        {
            (2, 12): "5ce3fbd13a53f73e",
            (2, 13): "5ce3fbd13a53f73e",
            (2, 14): "5ce3fbd13a53f73e",
            (2, 15): "5ce3fbd13a53f73e",
        },
    ),
)


def fix_rows(release: Release) -> tuple[Patch, ...]:
    """The rows of every fix that applies to ``release``, in :data:`FIXES` order."""
    return tuple(f.row(release) for f in FIXES if release in f.fingerprints)
