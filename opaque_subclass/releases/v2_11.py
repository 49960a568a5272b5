"""torch 2.11: the backport. Everything the library does on this release.

torch 2.11 has the opaque registry but not opaque attributes of tensor
subclasses: ``import opaque_subclass`` applies the patches below, all or none,
so that torch.compile, AOTAutograd, export, parametrizations, FSDP and
DTensor handle them as torch 2.13 does. Every row replaces one torch
function: its qualified name, the fingerprint of the original's source (a
torch build whose source differs is refused whole, nothing patched), and where
the replacement's factory lives (its docstring says what fails without it and
what changes with it). ``support().patched`` lists them, ``disable()`` removes
them; docs/backport.md describes each.
"""

from __future__ import annotations

from opaque_subclass.patching import Patch
from opaque_subclass.releases.fix_table import fix_rows
from opaque_subclass.releases.schema import OPAQUE_OBJECT_API, Difference, ReleaseSupport
from opaque_subclass.releases.shared import ATTRIBUTE_SOURCE_ENTRIES, ATTRIBUTE_SOURCE_TEXT, FOREIGN_ISINSTANCE
from opaque_subclass.releases.sources import recorded_sources

RELEASE = ReleaseSupport(
    (2, 11),
    "backport",
    OPAQUE_OBJECT_API,
    patches=(
        # fake-tensor conversion (opaque_subclass/backport/fake.py)
        Patch(
            "torch._subclasses.meta_utils.MetaTensorDescriber.describe_tensor",
            "ebbda54b914e44d9",
            "opaque_subclass.backport.fake:make_describe_tensor",
        ),
        Patch(
            "torch._subclasses.fake_tensor.is_fake", "7a995a7d29311177", "opaque_subclass.backport.fake:make_is_fake"
        ),
        Patch(
            "torch._subclasses.fake_tensor.maybe_get_fake_mode",
            "3d1d38c36e678d21",
            "opaque_subclass.backport.fake:make_maybe_get_fake_mode",
        ),
        # Dynamo (backport/dynamo.py); the input check at its entry is core/checks.py's
        Patch(
            "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor",
            "4966eaf89fbb36bb",
            "opaque_subclass.backport.dynamo:make_wrap_tensor",
            caches=("torch._dynamo.variables.builder.VariableBuilder._type_dispatch_impl",),
        ),
        Patch(
            "torch._dynamo.variables.builder._automatic_dynamic",
            "6dad81d75732e4d5",
            "opaque_subclass.backport.dynamo:make_automatic_dynamic",
        ),
        # inductor (backport/inductor.py)
        Patch(
            "torch._inductor.ir.TorchBindObject.get_buf_bytes",
            "540b647bdbe020bb",
            "opaque_subclass.backport.inductor:make_get_buf_bytes",
        ),
        Patch(
            "torch._inductor.graph.GraphLowering.run_node",
            "0dc7ff30af726a00",
            "opaque_subclass.backport.inductor:make_run_node",
        ),
        Patch(
            "torch._inductor.codecache.FxGraphCache._check_for_hop",
            "8885b30700cb24e2",
            "opaque_subclass.backport.inductor:make_check_for_hop",
        ),
        Patch(
            "torch._dynamo.decorators._apply_func_to_inner_tensors_of_same_dim",
            "3afc131b44b9624f",
            "opaque_subclass.backport.dynamo:make_apply_to_inner_tensors",
        ),
        Patch(
            "torch._dynamo.variables.builder.handle_traced_output",
            "eff413dbb364ec0b",
            "opaque_subclass.backport.dynamo:make_handle_traced_output",
        ),
        Patch(
            "torch.fx.experimental.symbolic_shapes.ShapeEnv.produce_guards_verbose",
            "6c5798635dc1fbf3",
            "opaque_subclass.backport.dynamo:make_produce_guards_verbose",
        ),
        Patch(
            "torch._dynamo.variables.distributed.DeviceMeshVariable.is_device_mesh",
            "f6951f04a46572a5",
            "opaque_subclass.backport.dynamo:make_is_device_mesh",
            # the caller whose source tells a DTensor's mesh from a mesh input
            depends_on=(("torch._dynamo.variables.builder.VariableBuilder._wrap", "9d1bd3172bb5c702"),),
        ),
        Patch(
            "torch._dynamo.variables.distributed.ProcessGroupVariable.is_process_group",
            "3dde770c19833ad1",
            "opaque_subclass.backport.dynamo:make_is_process_group",
        ),
        # AOTAutograd (backport/aot_autograd.py) and its run-time wrapper (backport/runtime.py)
        Patch(
            "torch.fx.experimental.proxy_tensor.set_proxy_slot",
            "5fbc7c5250caf5b6",
            "opaque_subclass.backport.aot_autograd:make_set_proxy_slot",
        ),
        Patch(
            "torch._functorch._aot_autograd.subclass_utils.create_subclass_metadata",
            "7b4c0b5f0341af60",
            "opaque_subclass.backport.aot_autograd:make_create_subclass_metadata",
        ),
        Patch(
            "torch._functorch._aot_autograd.schemas.SubclassCreationMeta.__repr__",
            "856070f5cf6eb8f6",
            "opaque_subclass.backport.aot_autograd:make_metadata_repr",
        ),
        Patch(
            "torch._functorch._aot_autograd.schemas.ViewAndMutationMeta.__repr__",
            "d8295faef33be8a0",
            "opaque_subclass.backport.aot_autograd:make_metadata_repr",
        ),
        Patch(
            "torch._functorch._aot_autograd.subclass_utils.unwrap_tensor_subclasses",
            "11cc3ee45d7806e6",
            "opaque_subclass.backport.aot_autograd:make_unwrap_tensor_subclasses",
        ),
        Patch(
            "torch._functorch._aot_autograd.graph_capture_wrappers.sc_visit",
            "985398e20c16d699",
            "opaque_subclass.backport.aot_autograd:make_sc_visit",
        ),
        Patch(
            "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key",
            "e7516ac495df56aa",
            "opaque_subclass.backport.aot_autograd:make_autograd_cache_key",
        ),
        Patch(
            "torch._functorch._aot_autograd.functional_utils.is_fun",
            "717e7e67d125a4d1",
            "opaque_subclass.backport.aot_autograd:make_is_fun",
        ),
        Patch(
            "torch._functorch._aot_autograd.functional_utils.sync_functional_tensor",
            "a32ff6debc413a1d",
            "opaque_subclass.backport.aot_autograd:make_skip_opaque",
        ),
        Patch(
            "torch._functorch._aot_autograd.functional_utils.are_all_mutations_under_no_grad_or_inference_mode",
            "4c753f6f262dbd37",
            "opaque_subclass.backport.aot_autograd:make_skip_opaque",
        ),
        Patch(
            "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchSubclassWrapper.post_compile",
            "cf6a953d4963e9cc",
            "opaque_subclass.backport.runtime:make_subclass_wrapper_post_compile",
        ),
        Patch(
            "torch._functorch._aot_autograd.subclass_utils.wrap_tensor_subclasses",
            "a34a0b2d6a810e7b",
            "opaque_subclass.backport.runtime:make_wrap_tensor_subclasses",
        ),
        Patch(
            "torch._functorch._aot_autograd.runtime_wrappers.runtime_unwrap_tensor_subclasses",
            "6c67b34e3c9d3bbc",
            "opaque_subclass.backport.runtime:make_saved_values_unwrap",
            scope="here",
        ),
        # torch.export (backport/export.py) and its archive (backport/archive.py)
        Patch(
            "torch._export.non_strict_utils._create_symbolic_context_for_tensor",
            "51ef4dde85a39546",
            "opaque_subclass.backport.export:make_symbolic_context",
        ),
        Patch(
            "torch._export.passes.lift_constants_pass.lift_constants_pass",
            "20bbf233fd37a37e",
            "opaque_subclass.backport.export:make_lift_constants_pass",
        ),
        Patch(
            "torch.export.unflatten._assign_attr",
            "364fb4f027a9f58d",
            "opaque_subclass.backport.export:make_assign_attr",
        ),
        Patch(
            "torch._dynamo.convert_frame.fullgraph_capture",
            "681d491516e4b6c6",
            "opaque_subclass.backport.export:make_fullgraph_capture",
            depends_on=(("torch._dynamo.functional_export._dynamo_graph_capture_for_export", "f4e25be375af4e1b"),),
        ),
        Patch(
            "torch.export.pt2_archive._package._package_constants",
            "c503d4b5c778fbd4",
            "opaque_subclass.backport.archive:make_package_constants",
        ),
        Patch(
            "torch.export.pt2_archive._package._load_constants",
            "23b892b69c176401",
            "opaque_subclass.backport.archive:make_load_constants",
        ),
        Patch(
            "torch.export.pt2_archive._package._save_pickled_tensors",
            "f76ccca3106461df",
            "opaque_subclass.backport.archive:make_save_pickled_tensors",
        ),
        # nn.utils.parametrize (backport/parametrize.py)
        Patch(
            "torch.nn.utils.parametrize.ParametrizationList.__init__",
            "4ba455d7a2794631",
            "opaque_subclass.backport.parametrize:make_init",
        ),
        Patch(
            "torch.nn.utils.parametrize.ParametrizationList.right_inverse",
            "3ee33189db9332e2",
            "opaque_subclass.backport.parametrize:make_right_inverse",
        ),
        Patch(
            "torch._functorch._aot_autograd.subclass_parametrization.UnwrapTensorSubclass.right_inverse",
            "b059ddfb4b07ce30",
            "opaque_subclass.backport.parametrize:make_unwrap_right_inverse",
        ),
        Patch(
            "torch._functorch._aot_autograd.subclass_parametrization.UnwrapTensorSubclass.forward",
            "3121306112ee0f7e",
            "opaque_subclass.backport.parametrize:make_unwrap_forward",
        ),
        # FSDP and memory accounting (backport/distributed.py)
        Patch(
            "torch.distributed.fsdp._init_utils._sync_module_params_and_buffers",
            "bfb90d4b39992fcc",
            "opaque_subclass.backport.distributed:make_sync_module_states",
        ),
        Patch(
            "torch.distributed._tools.common_utils.get_untyped_storages",
            "8e2ccff94d44617e",
            "opaque_subclass.backport.distributed:make_get_untyped_storages",
        ),
        # collectives taking an opaque group (backport/collectives.py)
        Patch(
            "torch._dynamo.variables.builtin.BuiltinVariable.call_isinstance",
            "cc574567c9dbb8e7",
            "opaque_subclass.backport.collectives:make_call_isinstance",
            caches=("torch._dynamo.variables.builtin.BuiltinVariable.call_function_handler_cache",),
        ),
        Patch(
            "torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr",
            "1173580d17b2fb7b",
            "opaque_subclass.backport.collectives:make_var_getattr",
        ),
        # DTensor's mesh as an opaque attribute (backport/dtensor.py)
        Patch(
            "torch.distributed.tensor._api.DTensor.__tensor_flatten__",
            "3b0b2582b79e7389",
            "opaque_subclass.backport.dtensor:make_tensor_flatten",
        ),
        Patch(
            "torch.distributed.tensor._api.DTensor.__tensor_unflatten__",
            "f7cf6b23a032ba1d",
            "opaque_subclass.backport.dtensor:make_tensor_unflatten",
        ),
        Patch(
            "torch.fx.experimental.proxy_tensor.get_proxy_slot",
            "bee66aa81c0660c6",
            "opaque_subclass.backport.dtensor:make_get_proxy_slot",
        ),
        Patch(
            "torch._dynamo.variables.torch.TorchInGraphFunctionVariable._get_handlers",
            "5336cc9cf9ad95ce",
            "opaque_subclass.backport.dtensor:make_get_handlers",
        ),
        Patch(
            "torch._dynamo.variables.tensor.TensorVariable.method_redistribute",
            "07fdc792fb977468",
            "opaque_subclass.backport.dtensor:make_method_redistribute",
        ),
        Patch(
            "torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr",
            "3e72d97b291dff28",
            "opaque_subclass.backport.dtensor:make_dynamic_getattr",
        ),
        # the fixes 2.11 shares with the native releases (input checks, errors reaching the user,
        # member guards, tangents, opaque protocols, parametrization leaves, mesh guards), written
        # once in the table of fixes: releases/fix_table.py
        *fix_rows((2, 11)),
    ),
    differences=(
        Difference(
            "a member of an opaque read while AOTAutograd traces (a subclass's __torch_dispatch__ or a "
            "custom op's fake kernel calling mesh.get_coordinate()) fails the compilation "
            "(BackendCompilerFailed naming the member): torch 2.11's fake wrapper of an opaque answers "
            "no member. 2.12 and newer bind the declared members onto it and compile in the real "
            "object's value; the library then keeps the guard on such a mesh's whole rank map. So does a "
            "__torch_dispatch__ issuing a functional collective on its group attribute (the group's name "
            "is such a member), with or without share_compiles",
            (
                "members/device-mesh-coordinate-below-dynamo",
                "compile_passes/osc005-one-finding-per-call-and-its-guard",
                "dtensor/share-compiles-runs-on-a-group-input",
            ),
        ),
        Difference(
            "torch 2.11's Dynamo puts DTensor's from_local, redistribute and to_local in a graph as "
            "closures over the mesh and placements (fn_with_prim_types), which its AOTAutograd cache "
            "refuses: under opaque_subclass.dtensor.share_compiles the collectives still run on each "
            "input mesh's own group, but every rank compiles (a cache bypass); 2.12 and newer call "
            "them by name and the job compiles once. So a graph that uses this rank's position in a mesh "
            "(a Replicate -> Shard redistribution) compiles on 2.11, where no other rank can load it, and "
            "is refused (ShareCompilesError) on 2.12 and newer",
            ("dtensor/share-compiles-runs-on-the-input-meshs-group", "dtensor/share-compiles-job-of-two-ranks"),
        ),
        Difference(
            "a DTensor made in the compiled region on a DeviceMesh argument (DTensor.from_local(t, mesh, "
            "...)): torch 2.11's Dynamo keeps such a mesh as a constant of the graph, not a graph input "
            "(2.12 and newer lift it), so the graph returns the mesh as a constant: inductor compiles it "
            "with the backport's run_node patch, but neither AOTAutograd's nor the FX graph cache may "
            "keep it (the FX graph cache cannot restore an opaque constant; the backport's "
            "_check_for_hop patch refuses it): each compilation compiles anew, with the same values",
            ("upstream/183999-dtensor-built-on-a-mesh-input",),
        ),
        Difference(
            "torch 2.11 does not register enum.Enum as a value opaque (2.12 and newer do): "
            "opaque_kind(AnEnum) is None until register_opaque(AnEnum, kind='value')",
            ("api/enum-is-value-opaque",),
        ),
        Difference(
            "torch.export.save on a program holding reference opaques raises TypeError with the fix "
            "opaque_subclass.export.save (the backport's archive patch); torch 2.12 and newer pickle "
            "them by value and offer no hook to refuse",
            ("export/torch-save-direct",),
        ),
        Difference(ATTRIBUTE_SOURCE_TEXT, ATTRIBUTE_SOURCE_ENTRIES),
        Difference(
            "a mesh that reaches DTensor.from_local or redistribute in compiled code only as an "
            "argument (not read from a DTensor input) is compiled in, guarded by equality: a later "
            "call with an equal mesh returns a DTensor on the first call's mesh (2.12 and newer: the "
            "mesh passed in). Dynamo 2.11's DTensor handlers take the mesh as a constant and its fake "
            "wrapper of an opaque input holds a copy, so the traced mesh cannot be matched to the input",
            ("dtensor/from-local-mesh-argument/8-ranks",),
        ),
        Difference(
            "torch 2.11's CUDA build without a GPU crashes (SIGSEGV in FakeTensorMode.__enter__) "
            "when a thread compiles after another compiling thread has exited, with or without "
            "the library: compile from one long-lived thread",
            ("threads/compile-after-thread-exit",),
        ),
        Difference(
            "torch 2.11's Dynamo cannot return a value opaque constructed inside the compiled region "
            "(Unsupported: reconstruction failure), with or without the library; 2.12 and newer return "
            "it (the library fixes pytorch/pytorch#193190 on 2.12 - 2.14, where such an object beside "
            "a subclass output came back as torch's fake wrapper or None). Construct it outside the "
            "compiled function and pass it in, or return it from eager code",
            ("upstream/193190-value-opaque-beside-subclass-output",),
        ),
        Difference(
            "a method of a callable value opaque (one defining __call__) read off a subclass tensor "
            "made inside the compiled region (y = t + 1; y._config.factor()) is a graph break "
            "(Unsupported under fullgraph=True; calling the opaque itself compiles): torch 2.11's "
            "Dynamo takes such an attribute for a generic one (pytorch/pytorch#188796). 2.12 - 2.14 "
            "get the library's fix, 2.15 torch's. Read the member off an input instead, or call it "
            "outside the compiled function",
            ("upstream/188796-callable-value-opaque-on-intermediate",),
        ),
        Difference(
            "a compiled region that Dynamo compiles while an outer make_fx trace runs "
            "(torch._dynamo.config.force_compile_during_fx_trace, as torchtitan's graph trainer nests "
            "regions) fails on torch 2.11: with plain tensors torch itself fails (AssertionError: Guard "
            "failed on the same frame it was created, on the outer tracer's state); with an opaque "
            "attribute the backport's trace reaches torch 2.11's AssertionError 'expected all "
            "opaque_object_outs to be opaque types' first (its compiled forward does not take torch's "
            "fake wrapper of an opaque saved for backward; 2.12 does), and accepting the wrapper there "
            "only leads to the plain-tensor failure. Nested compiled regions need torch 2.12 or newer "
            "(pytorch/pytorch#179047)",
            ("upstream/179047-nested-compile-under-outer-trace",),
        ),
    ),
    limits=(FOREIGN_ISINSTANCE,),
    sources=recorded_sources((2, 11)),  # digests of the torch files read: releases/sources.json
)
