"""Native-mode fixes: each fix of the running release's fix set (the version
table's ``fixes`` module) is listed, documented, and needed: its scenario
passes with the fix and, when only that fix is suspended, fails exactly as
recorded (the exception's type and message, measured on each release). On a
release without fixes every test here is skipped."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
import torch
from scenarios import (
    ANOTHER_GROUPS_ENTRY_FAILURE,
    ANSWERING_OPAQUE_FAILURE,
    DELETED_LEAF_FAILURE,
    DTENSOR_CACHED_MESH_FAILURE,
    ENTRY_GUARD_UNREAD_FAILURE,
    FLATTEN_GUARDED_PER_INPUT_FAILURE,
    LIBRARY_ERROR_WRAPPED_FAILURE,
    LOAD_CONSTANT_FAILURE,
    MALFORMED_NAMES_FAILURE,
    MEMBER_UNGUARDED_FAILURE,
    MESH_READ_UNSEEN_FAILURE,
    MESH_RECOMPILED_FAILURE,
    SAVE_CONSTANT_FAILURE,
    SAVED_OPAQUE_CHECK_FAILURE,
    SHARED_CHUNK_FAILURE,
    SHARED_NEW_SHARD_DIM_FAILURE,
    TANGENT_LIST_FAILURE,
    UNDECLARED_MEMBER_FAILURE,
    WRONG_UNFLATTEN_EXPORTED,
    StockFailure,
    assert_fails_as,
    backward_refuses_a_tangent_listing_other_attributes,
    compile_raises_the_librarys_error,
    compile_takes_an_opaque_answering_every_name,
    constant_flatten_guarded_once_per_class,
    dtensor_programs_keep_runtime_meshes,
    export_names_a_wrong_unflatten,
    export_names_malformed_flatten_names,
    fresh_inductor_cache,
    member_method_result_is_guarded,
    mesh_read_below_dynamo_keeps_its_guard,
    meshes_of_one_shape_compile_once,
    no_rank_loads_another_groups_entry,
    parametrization_names_a_deleted_opaque_leaf,
    save_and_load_opaque_constant,
    saved_opaques_checked_once_per_class,
    share_compiles_refuses_the_chunk_of_an_output,
    share_compiles_refuses_the_new_shard_dim_of_an_output,
    undeclared_member_is_named,
)
from subclasses import ForeignHandle, ForeignTensor, Mesh, MeshTensor
from upstream_scenarios import (
    CALLABLE_VALUE_FAILURE,
    MADE_WHILE_TRACING_FAILURE,
    SET_CONTEXT_FAILURE,
    UNTRACED_FUNCTION_FAILURE,
    VALUE_OPAQUE_OUTPUT_FAILURE,
    callable_value_opaque_on_an_intermediate_compiles,
    checkpointed_untraced_function_is_not_served_stale,
    equal_set_contexts_share_a_cache_entry,
    reference_opaque_made_while_tracing_is_named,
    value_opaque_beside_subclass_output_survives_the_caches,
)

import opaque_subclass as osc
from opaque_subclass import activation
from opaque_subclass.releases import current

ROW = current()
FIX_SET = activation.FIXES  # the live set that import opaque_subclass enabled from ROW.fixes
needs_fixes = pytest.mark.skipif(FIX_SET is None, reason=f"no native fixes for torch {ROW.label}")


def _compile_foreign_class_attribute():
    """A class registered without inheriting OpaqueBase, as an attribute, through
    compile, backward: the output and gradient carry the call's own object."""
    f = torch.compile(lambda x: (x * 2).sum(), backend="aot_eager", fullgraph=True)
    handle = ForeignHandle("fix")
    x = ForeignTensor(torch.ones(3), handle).requires_grad_(True)
    f(x).backward()
    assert x.grad._handle is handle


def _export_module_with_opaque_constant():
    """``ExportedProgram.module()`` of a program whose lifted constant is an opaque."""

    class Scale(torch.nn.Module):
        def __init__(self, mesh):
            super().__init__()
            self.w = torch.nn.Parameter(_Lifted(torch.arange(3.0), mesh))

        def forward(self, x):
            return self.w * x

    mesh = Mesh("fix-export")
    module = osc.unwrap_subclass_parameters(Scale(mesh))
    ep = torch.export.export(module, (torch.ones(3),), strict=False)
    assert ep.module()(torch.ones(3))._mesh is mesh


def _backward_logs_no_deprecation():
    """A compiled backward whose graph holds an opaque logs none of torch's
    deprecation warnings about opaque-object names."""
    import logging

    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(level=logging.WARNING)
    logger = logging.getLogger("torch._library.opaque_object")
    logger.addHandler(handler)
    try:
        f = torch.compile(lambda x: (x * x).sum(), backend="aot_eager", fullgraph=True)
        mesh = Mesh("no-deprecation")
        x = MeshTensor(torch.ones(3), mesh).requires_grad_(True)
        f(x).backward()
    finally:
        logger.removeHandler(handler)
    assert x.grad._mesh is mesh
    logged = [r.getMessage() for r in records if "deprecated" in r.getMessage()]
    assert not logged, f"torch logged: {logged}"


def _inductor_cache_keeps_sharing_apart():
    """With torch's caches on (a fresh cache directory), a call with distinct
    meshes after one with a shared mesh gets its own meshes back."""
    with fresh_inductor_cache():
        f = torch.compile(lambda x, y: (x + y, y * 2), backend="inductor", fullgraph=True)
        m = Mesh("shared")
        f(MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), m))
        a, b = Mesh("a"), Mesh("b")
        o1, o2 = f(MeshTensor(torch.ones(2), a), MeshTensor(torch.ones(2), b))
        assert o1._mesh is a and o2._mesh is b, (
            f"outputs carry {o1._mesh} and {o2._mesh}, expected Mesh('a') and Mesh('b')"
        )


class _Lifted(osc.OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


def _bad_attribute():
    x = MeshTensor(torch.ones(2), Mesh("bad"))
    x._mesh = 3  # an int where an opaque is listed
    return x


def _compile_names_a_bad_attribute():
    """torch.compile of a subclass argument listing an int: the library's
    TypeError, raised as itself (not wrapped by Dynamo)."""
    f = torch.compile(lambda x: x + 1, backend="aot_eager", fullgraph=True)
    with pytest.raises(osc.OpaqueTypeError) as info:
        f(_bad_attribute())
    msg = str(info.value)
    assert "MeshTensor.__tensor_flatten__()" in msg and "L['x']._mesh" in msg, msg
    assert "holds int" in msg and "Fix:" in msg, msg


@needs_fixes
def test_export_names_a_bad_attribute_from_torchs_failure():
    """Non-strict export of a subclass input listing an int: the library's
    TypeError, raised by the ``fakify`` fix from torch's own failure (the
    bare "expected Tensor or OpaqueBase"), which it chains."""

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(TypeError) as info:
        torch.export.export(Double(), (_bad_attribute(),), strict=False)
    msg = str(info.value)
    assert "MeshTensor.__tensor_flatten__()" in msg and "L['x']._mesh" in msg, msg
    assert "holds int" in msg and "Fix:" in msg, msg
    assert isinstance(info.value.__cause__, AssertionError), info.value.__cause__
    with (
        FIX_SET.suspended("torch._export.non_strict_utils.fakify"),
        pytest.raises(AssertionError, match="expected Tensor or"),
    ):
        torch.export.export(Double(), (_bad_attribute(),), strict=False)


#: The end of a scenario's own assertion message (pytest may append its explanation).
_END = r"(\n|$)"
#: What torch's assertion on a flattened attribute calls its base class, by release.
_TORCH_BASE_NAME = {
    (2, 12): "OpaqueBase",
    (2, 13): "OpaqueBase",
    (2, 14): "CustomClassBase",
    (2, 15): "CustomClassBase",
}


def _expected_tensor_or_base(found: str) -> dict[tuple[int, int], StockFailure]:
    """torch's AssertionError for a listed attribute that is neither a tensor
    nor an instance of its base class (Dynamo appends "from user code")."""
    return {
        release: StockFailure(AssertionError, rf"^expected Tensor or {base}, got <class '{found}'>(\n|$)")
        for release, base in _TORCH_BASE_NAME.items()
    }


#: target -> (the scenario that needs the fix, how it fails on stock torch with
#: just that fix suspended: one StockFailure, or one per release where the
#: message differs). Measured on torch 2.12.0, 2.13.0, 2.14.1 and 2.15.0.
NEEDED_BY: dict[str, tuple[Callable[[], object], StockFailure | Mapping[tuple[int, int], StockFailure]]] = {
    "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent": (  # 2.12 - 2.15
        # a wrong result: the gradient carries the tangent's attribute at the output's name
        backward_refuses_a_tangent_listing_other_attributes,
        TANGENT_LIST_FAILURE,
    ),
    "torch._library.fake_class_registry.tracing_with_real": (  # 2.12 - 2.15
        compile_takes_an_opaque_answering_every_name,
        ANSWERING_OPAQUE_FAILURE,
    ),
    "torch.nn.utils.parametrize.ParametrizationList.forward": (
        # the opaque leaf's AttributeError hidden by the property: the property is reported missing
        parametrization_names_a_deleted_opaque_leaf,
        DELETED_LEAF_FAILURE,
    ),
    "torch._functorch._aot_autograd.runtime_wrappers.is_opaque_type": (  # also 2.11's patch
        # torch's registry asked per saved opaque on every forward
        saved_opaques_checked_once_per_class,
        SAVED_OPAQUE_CHECK_FAILURE,
    ),
    "torch._functorch._aot_autograd.runtime_wrappers.is_custom_class": (  # 2.14, 2.15
        saved_opaques_checked_once_per_class,
        SAVED_OPAQUE_CHECK_FAILURE,
    ),
    "torch._dynamo.guards.GuardBuilder.TENSOR_SUBCLASS_METADATA_MATCH": (  # also 2.11's patch
        # torch's context check, a Python call of __tensor_flatten__ per input and call
        constant_flatten_guarded_once_per_class,
        FLATTEN_GUARDED_PER_INPUT_FAILURE,
    ),
    "torch._dynamo.guards.GuardBuilder.EQUALS_MATCH": (  # also 2.11's patch
        # torch's attribute-list check, a Python call of __tensor_flatten__ per input and call
        constant_flatten_guarded_once_per_class,
        FLATTEN_GUARDED_PER_INPUT_FAILURE,
    ),
    "torch._dynamo.guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH": (  # also 2.11's patch
        # torch's guard on the whole rank map: one compilation per mesh of one shape
        meshes_of_one_shape_compile_once,
        MESH_RECOMPILED_FAILURE,
    ),
    "torch._library.fake_class_registry.FakeScriptObject.__getattribute__": (  # 2.12 - 2.15
        # a read below Dynamo unrecorded: the narrow guard serves the first mesh's coordinate
        mesh_read_below_dynamo_keeps_its_guard,
        MESH_READ_UNSEEN_FAILURE,
    ),
    "torch.distributed.device_mesh.DeviceMesh._sym_get_coordinate": (  # 2.12 - 2.15
        # a wrong result: the other ranks of a job load this rank's chunk under share_compiles
        share_compiles_refuses_the_chunk_of_an_output,
        SHARED_CHUNK_FAILURE,
    ),
    "torch.distributed.device_mesh.DeviceMesh.get_coordinate": (  # 2.12 - 2.15
        share_compiles_refuses_the_new_shard_dim_of_an_output,
        SHARED_NEW_SHARD_DIM_FAILURE,
    ),
    "torch._subclasses.fake_tensor.get_plain_tensors": (
        export_names_malformed_flatten_names,
        MALFORMED_NAMES_FAILURE,
    ),
    "torch.export.pt2_archive._package._package_constants": (  # 2.12
        save_and_load_opaque_constant,
        SAVE_CONSTANT_FAILURE,
    ),
    "torch.export.pt2_archive._package._load_constants": (  # 2.12
        save_and_load_opaque_constant,
        LOAD_CONSTANT_FAILURE,
    ),
    "torch._opaque_base.OpaqueBaseMeta.__instancecheck__": (  # 2.12
        _compile_foreign_class_attribute,
        StockFailure(AssertionError, r"^expected Tensor or OpaqueBase, got <class 'subclasses\.ForeignHandle'>\n"),
    ),
    "torch.export.unflatten._assign_attr": (  # 2.12
        _export_module_with_opaque_constant,
        StockFailure(
            AssertionError,
            r"^expected torch\.Tensor or torch\.ScriptObject for CONSTANT attr_kind, got <class 'subclasses\.Mesh'>$",
        ),
    ),
    "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.save": (  # 2.11 - 2.15
        # another group's program: rank 2 gets the entry rank 0 compiled for group '1'
        no_rank_loads_another_groups_entry,
        ANOTHER_GROUPS_ENTRY_FAILURE,
    ),
    "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.evaluate_guards": (  # 2.11 - 2.15
        # torch's guard evaluation cannot read the record: no rank gets the entry, not even its group's
        no_rank_loads_another_groups_entry,
        ENTRY_GUARD_UNREAD_FAILURE,
    ),
    "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key": (  # 2.12 - 2.15
        _inductor_cache_keeps_sharing_apart,
        # A wrong result: the entry compiled for the shared mesh is served.
        StockFailure(
            AssertionError, r"^outputs carry Mesh\('a'\) and Mesh\('a'\), expected Mesh\('a'\) and Mesh\('b'\)" + _END
        ),
    ),
    "torch._functorch.partitioners.is_opaque_value": (  # 2.14, 2.15
        _backward_logs_no_deprecation,
        StockFailure(
            AssertionError,
            r"^torch logged: \['is_opaque_value is deprecated, use is_custom_class_obj instead'\]" + _END,
        ),
    ),
    "torch._dynamo.variables.script_object.TorchScriptObjectVariable.call_method": (  # 2.12, 2.13
        member_method_result_is_guarded,
        MEMBER_UNGUARDED_FAILURE,
    ),
    "torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr": (  # 2.12, 2.13
        undeclared_member_is_named,
        UNDECLARED_MEMBER_FAILURE,
    ),
    "torch._dynamo.variables.script_object.CustomClassObjectVariable.call_method": (  # 2.14, 2.15
        member_method_result_is_guarded,
        MEMBER_UNGUARDED_FAILURE,
    ),
    "torch._dynamo.variables.script_object.CustomClassObjectVariable.tp_getattro_impl": (  # 2.14, 2.15
        undeclared_member_is_named,
        UNDECLARED_MEMBER_FAILURE,
    ),
    "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor": (  # 2.12 - 2.15
        _compile_names_a_bad_attribute,
        _expected_tensor_or_base("int"),
    ),
    "torch._export.non_strict_utils.fakify": (  # 2.12 - 2.15
        # a silent wrong result: the input is traced as the plain tensor its __tensor_unflatten__ returns
        export_names_a_wrong_unflatten,
        WRONG_UNFLATTEN_EXPORTED,
    ),
    "torch.fx.experimental.proxy_tensor.get_proxy_slot": (  # 2.12 - 2.15
        # A wrong result: the output's mesh is an equal one of an earlier program, compiled in.
        dtensor_programs_keep_runtime_meshes,
        DTENSOR_CACHED_MESH_FAILURE,
    ),
    "torch._functorch._aot_autograd.subclass_utils.unwrap_tensor_subclasses": (  # 2.12 - 2.14
        # a wrong result: torch's fake wrapper (2.12, 2.13) or None from the caches (2.14)
        value_opaque_beside_subclass_output_survives_the_caches,
        VALUE_OPAQUE_OUTPUT_FAILURE,
    ),
    "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCachePickler._default_stable_hash_for_caching": (
        # 2.12 - 2.14: a frozenset context keys apart by its iteration order (pytorch#193418)
        equal_set_contexts_share_a_cache_entry,
        SET_CONTEXT_FAILURE,
    ),
    "torch._functorch._aot_autograd.autograd_cache.check_cacheable": (  # 2.11 - 2.15
        # a wrong result (pytorch#194658): a checkpointed untraced function served stale
        checkpointed_untraced_function_is_not_served_stale,
        UNTRACED_FUNCTION_FAILURE,
    ),
    "torch.fx.experimental.proxy_tensor.PythonKeyTracer.create_arg": (  # 2.11 - 2.15
        # a wrong result: the Tally made while tracing compiled in, shared by every call
        reference_opaque_made_while_tracing_is_named,
        MADE_WHILE_TRACING_FAILURE,
    ),
    "torch._opaque_base.OpaqueBaseMeta.__call__": (  # 2.11 - 2.13 (nothing recorded, nothing refused)
        reference_opaque_made_while_tracing_is_named,
        MADE_WHILE_TRACING_FAILURE,
    ),
    "torch._custom_class_base.CustomClassBaseMeta.__call__": (  # 2.14, 2.15
        reference_opaque_made_while_tracing_is_named,
        MADE_WHILE_TRACING_FAILURE,
    ),
    "torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr": (  # 2.12 - 2.14
        # a graph break (Unsupported under fullgraph=True)
        callable_value_opaque_on_an_intermediate_compiles,
        CALLABLE_VALUE_FAILURE,
    ),
    "torch._dynamo.convert_frame._compile": (  # 2.12 - 2.15
        # the library's error re-raised as InternalTorchDynamoError("OpaqueTypeError: ...")
        compile_raises_the_librarys_error,
        LIBRARY_ERROR_WRAPPED_FAILURE,
    ),
}


def _stock_failure(target: str) -> StockFailure:
    expected = NEEDED_BY[target][1]
    if isinstance(expected, StockFailure):
        return expected
    assert ROW.release in expected, f"no stock failure recorded for {target} on torch {ROW.label}: measure it"
    return expected[ROW.release]


@needs_fixes
def test_support_lists_every_fix():
    assert osc.support().mode == "native" and osc.support().patched == ()
    assert osc.support().fixes == tuple(p.target for p in FIX_SET.patches)


@needs_fixes
def test_every_fix_has_a_scenario():
    assert {p.target for p in FIX_SET.patches} <= set(NEEDED_BY)


@needs_fixes
def test_every_fix_documents_what_it_replaces():
    for p in FIX_SET.patches:
        doc = " ".join(p.doc.split())
        assert f"``{p.target}``" in doc, p.target
        assert "Replaces" in doc and "torch " in doc and ROW.label in doc, p.target
        assert "Without it" in doc and "With it" in doc, p.target


@needs_fixes
@pytest.mark.parametrize("target", [p.target for p in FIX_SET.patches] if FIX_SET else [])
def test_fix_is_needed(target):
    """The scenario passes with the fix, and with just this fix suspended fails
    exactly as recorded for the running release (type and message)."""
    scenario = NEEDED_BY[target][0]
    stock_failure = _stock_failure(target)
    torch._dynamo.reset()
    scenario()
    torch._dynamo.reset()
    try:
        with FIX_SET.suspended(target):
            assert_fails_as(scenario, stock_failure)
    finally:
        torch._dynamo.reset()
