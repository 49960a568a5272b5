"""Scenario bodies shared by several test modules.

A scenario runs one piece of torch on the fixtures of :mod:`subclasses` and
asserts the outcome. Test modules call them (``test_opaque_obj_v2.py`` as its
own tests, ``tests/test_backport.py`` and ``tests/test_fixes.py`` to show that a
patch or fix is needed), so that no test module imports another. An assertion
that guards against a wrong result says what it found: the tests that remove a
patch match that message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import re
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from subclasses import (
    Anything,
    ConstantMeshTensor,
    CoordinateShifted,
    Gauge,
    GaugeTensor,
    GroupTensor,
    HoldsMesh,
    Listing,
    Mesh,
    MeshTensor,
    ReturnsPlain,
    SetNames,
    fake_world,
)

__all__ = [
    "ANOTHER_GROUPS_ENTRY_FAILURE",
    "ANSWERING_OPAQUE_FAILURE",
    "DELETED_LEAF_FAILURE",
    "DTENSOR_MESH_CONSTANT_FAILURE",
    "ENTRY_GUARD_UNREAD_FAILURE",
    "FLATTEN_GUARDED_PER_INPUT_FAILURE",
    "GENERIC_GRADIENT_WALK_FAILURE",
    "LIBRARY_ERROR_WRAPPED_FAILURE",
    "LOAD_CONSTANT_FAILURE",
    "MALFORMED_NAMES_FAILURE",
    "MEMBER_UNGUARDED_FAILURE",
    "SAVED_OPAQUE_CHECK_FAILURE",
    "SAVED_VALUES_WALK_FAILURE",
    "SAVE_CONSTANT_FAILURE",
    "SHARED_CHUNK_FAILURE",
    "SHARED_NEW_SHARD_DIM_FAILURE",
    "TANGENT_LIST_FAILURE",
    "UNDECLARED_MEMBER_FAILURE",
    "WRONG_UNFLATTEN_EXPORTED",
    "Scale",
    "StockFailure",
    "assert_fails_as",
    "backward_refuses_a_tangent_listing_other_attributes",
    "compile_raises_the_librarys_error",
    "compile_takes_an_opaque_answering_every_name",
    "compiled_member_uses",
    "compiled_undeclared_member",
    "constant_flatten_guarded_once_per_class",
    "direct_save_of_subclass_parameter_is_refused",
    "dtensor_handlers_take_registered_mesh",
    "dtensor_outputs_on_runtime_mesh",
    "export_names_a_wrong_unflatten",
    "export_names_malformed_flatten_names",
    "frames_started",
    "fsdp1_module_state_sync_keeps_opaques",
    "gradients_rebuilt_by_generated_code",
    "member_method_result_is_guarded",
    "no_rank_loads_another_groups_entry",
    "parametrization_names_a_deleted_opaque_leaf",
    "program_on_groups_compiles_once",
    "python_flatten_calls_per_input",
    "save_and_load_opaque_constant",
    "saved_opaques_checked_once_per_class",
    "saved_values_passed_without_a_walk",
    "share_compiles_refuses_the_chunk_of_an_output",
    "share_compiles_refuses_the_new_shard_dim_of_an_output",
    "storage_accounting_skips_opaques",
    "torch_subclass_parametrization_keeps_opaques",
    "undeclared_member_is_named",
]


@dataclasses.dataclass(frozen=True)
class StockFailure:
    """How a scenario fails on stock torch, that is with one patch or fix removed.

    Attributes
    ----------
    type
        The exception's exact type (a subclass of it does not match).
    match
        Regular expression searched (``re.search``) in ``str(exception)``. For a
        wrong result, the message of the scenario's own assertion naming it.
    logged
        For an exception that only points to torch's log ("check the warnings
        above"): a regular expression searched in what ``logger`` logged
        meanwhile (messages with their tracebacks).
    logger
        The torch logger that ``logged`` reads (torch's registered log names,
        such as ``torch.export``, do not propagate to ``torch``).
    """

    type: type[Exception]
    match: str
    logged: str | None = None
    logger: str = "torch"


def assert_fails_as(scenario: Callable[[], object], failure: StockFailure) -> None:
    """Run ``scenario`` and check that it fails exactly as ``failure`` says."""
    logged: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += "\n" + "".join(traceback.format_exception(record.exc_info[1]))
            logged.append(text)

    handler = Collect(level=logging.WARNING)
    logger = logging.getLogger(failure.logger)
    logger.addHandler(handler)
    try:
        with pytest.raises(failure.type, match=failure.match) as info:
            scenario()
    finally:
        logger.removeHandler(handler)
    assert type(info.value) is failure.type, f"raised {type(info.value).__qualname__}, a subclass of {failure.type}"
    if failure.logged is not None:
        assert any(re.search(failure.logged, text) for text in logged), (
            f"torch logged nothing matching {failure.logged!r}: {logged}"
        )


class Scale(torch.nn.Module):
    """``w * x + 1`` with ``w`` a parameter (a subclass in these scenarios)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x + 1


def torch_subclass_parametrization_keeps_opaques(backend: str) -> None:
    """torch's ``unwrap_tensor_subclass_parameters`` on a nested MeshTensor
    parameter: the opaques become plain attributes of the parametrization, the
    rebuilt parameter (eager and compiled) carries them, and a new opaque
    assigned later is used without recompiling."""
    import torch._dynamo.testing
    from torch._functorch._aot_autograd.subclass_parametrization import unwrap_tensor_subclass_parameters

    inner, outer = Mesh("inner"), Mesh("outer")
    module = unwrap_tensor_subclass_parameters(Scale(MeshTensor(MeshTensor(torch.arange(3.0), inner), outer)))
    plist = module.parametrizations.w
    assert plist.original1 is inner and plist.original2 is outer
    assert list(module.state_dict()) == ["parametrizations.w.original0"]
    w = module.w
    assert w._mesh is outer and w._data._mesh is inner and torch.equal(w._data._data, torch.arange(3.0))
    # Compiled, the rebuilt parameter carries the module's opaques (graph inputs
    # read from the module), and a new opaque assigned later is used without
    # recompiling.
    cnt = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(module, backend=cnt, fullgraph=True)
    with torch.no_grad():
        out = compiled(torch.full((3,), 2.0))
        assert out._mesh is outer and out._data._mesh is inner
        torch.testing.assert_close(out._data._data, torch.arange(3.0) * 2 + 1)
        plist.original2 = replaced = Mesh("replaced")
        out = compiled(torch.full((3,), 2.0))
    assert out._mesh is replaced and out._data._mesh is inner
    assert cnt.frame_count == 1


def storage_accounting_skips_opaques() -> None:
    """torch's ``get_untyped_storages`` counts the inner tensors' storages and
    no opaque (torch 2.11 without the backport warns for each opaque: an error
    here)."""
    from torch.distributed._tools.common_utils import get_untyped_storages

    data, inner_data = torch.ones(4), torch.zeros(2)
    x = MeshTensor(data, Mesh("s"))
    nested = MeshTensor(MeshTensor(inner_data, Mesh("in")), Mesh("out"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_untyped_storages(x) == {data.untyped_storage()}
        assert get_untyped_storages(nested) == {inner_data.untyped_storage()}


def fsdp1_module_state_sync_keeps_opaques() -> None:
    """FSDP1's module-state sync (one gloo process) broadcasts the tensors of
    subclass parameters and buffers and keeps their opaques.

    FSDP1's ``sync_module_states`` is GPU-only in torch; its device check is
    bypassed here so that the walk itself runs on CPU.
    """
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.fsdp import _init_utils

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    check = _init_utils._check_module_states_for_sync_module_states
    _init_utils._check_module_states_for_sync_module_states = lambda states: None
    try:
        mesh, inner = Mesh("fsdp"), Mesh("fsdp-inner")
        module = Scale(MeshTensor(MeshTensor(torch.arange(3.0), inner), mesh))
        module.register_buffer("b", MeshTensor(torch.ones(2), mesh))
        _init_utils._sync_module_params_and_buffers(module, list(module.parameters()), dist.group.WORLD)
        assert module.w._mesh is mesh and module.w._data._mesh is inner and module.b._mesh is mesh
        assert torch.equal(module.w._data._data, torch.arange(3.0))
    finally:
        _init_utils._check_module_states_for_sync_module_states = check
        dist.destroy_process_group()


def export_names_malformed_flatten_names() -> None:
    """Non-strict torch.export of a subclass input whose ``__tensor_flatten__``
    returns a set of names: the library's TypeError naming the method, what it
    returned and the fix, raised from torch's own failure."""

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    with pytest.raises(TypeError) as info:
        torch.export.export(Double(), (SetNames(torch.ones(2), Mesh("m")),), strict=False)
    msg = str(info.value)
    assert msg.startswith("subclasses.SetNames.__tensor_flatten__() at 'input' returned attribute names as set"), msg
    assert "Fix:" in msg and isinstance(info.value.__cause__, TypeError), msg


def export_names_a_wrong_unflatten() -> None:
    """Non-strict torch.export of a subclass input whose ``__tensor_unflatten__``
    returns the inner tensor: the library's TypeError naming the method, the
    input's path and what it returned, from the fake torch built (no rebuild
    of the real input)."""

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    try:
        torch.export.export(Double(), (ReturnsPlain(torch.ones(2), Mesh("m")),), strict=False)
    except TypeError as error:
        msg = str(error)
    else:
        raise AssertionError("exported without an error, tracing a plain tensor where the input is a ReturnsPlain")
    assert "ReturnsPlain.__tensor_unflatten__ (rebuilding \"L['x']\") returned torch.Tensor" in msg, msg
    assert "Fix:" in msg, msg


#: How export_names_a_wrong_unflatten fails without the fakify check (every
#: release 2.11 - 2.15): torch exports the program, silently.
WRONG_UNFLATTEN_EXPORTED = StockFailure(AssertionError, r"^exported without an error, tracing a plain tensor")


#: How export_names_malformed_flatten_names fails when torch's own walk of the
#: input is not diagnosed (every release 2.11 - 2.15): torch's TypeError, whose
#: message the scenario's assertion shows.
MALFORMED_NAMES_FAILURE = StockFailure(AssertionError, r"^'set' object is not reversible(\n|$)")


#: How save_and_load_opaque_constant fails when torch's archive writer, or its
#: reader, meets a reference opaque constant (torch 2.11 without the backport's
#: archive patch, 2.12 without its fix).
SAVE_CONSTANT_FAILURE = StockFailure(
    RuntimeError, r"^Unsupported constant type: <class 'opaque_subclass\.export\.archive\.OpaqueName'>$"
)
LOAD_CONSTANT_FAILURE = StockFailure(
    RuntimeError,
    r"^We ran into an error when deserializing the saved file\. Please check the warnings above",
    logged=r"Unsupported constant type: opaque_obj_0",
    logger="torch.export",
)


def save_and_load_opaque_constant() -> None:
    """opaque_subclass.export.save/load of a program whose lifted constant is a
    reference opaque: the loaded program runs with the loader's object."""
    import opaque_subclass.export as oexport

    ep = torch.export.export(HoldsMesh(Mesh("abc")), (torch.ones(2),), strict=False)
    buf = io.BytesIO()
    oexport.save(ep, buf, opaques={"mesh": ep.constants["lifted_custom_0"]})
    buf.seek(0)
    loaded = oexport.load(buf, opaques={"mesh": Mesh("loader")})
    assert torch.equal(loaded.module()(torch.ones(2)), torch.full((2,), 7.0))


def direct_save_of_subclass_parameter_is_refused() -> None:
    """torch.export.save of a program whose subclass parameter holds a reference
    opaque: refused, pointing to opaque_subclass.export.save, instead of
    pickling the mesh by value (torch 2.11 backport)."""

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(MeshTensor(torch.ones(2), Mesh("pickled-by-value")))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w * x

    ep = torch.export.export(Holder(), (torch.ones(2),), strict=False)
    try:
        torch.export.save(ep, io.BytesIO())
    except TypeError as error:
        assert "'w._mesh' (subclasses.Mesh)" in str(error) and "opaque_subclass.export.save(ep, f)" in str(error)
        return
    raise AssertionError("torch.export.save pickled the reference opaque of a subclass parameter by value")


def compiled_member_uses(fn: Callable[[torch.Tensor], torch.Tensor], gauges: list[Gauge]) -> list[float]:
    """``fn`` compiled (aot_eager, fullgraph) and called on a ``GaugeTensor`` of
    ones for each gauge; the outputs, checked against eager."""
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got = [compiled(GaugeTensor(torch.ones(1), g))._data.item() for g in gauges]
    expected = [fn(GaugeTensor(torch.ones(1), g))._data.item() for g in gauges]
    assert got == expected, f"outputs {got}, expected {expected}"
    return got


def member_method_result_is_guarded() -> None:
    """A ``Member.USE_REAL`` method's result is compiled in and guarded: a gauge
    whose ``factor()`` differs gets its own value (torch bakes the first)."""
    compiled_member_uses(lambda t: t * t._gauge.factor(), [Gauge(3), Gauge(5)])


def compiled_undeclared_member() -> None:
    """Compiled code calling a member the registration does not declare."""
    compiled_member_uses(lambda t: t * t._gauge.other(), [Gauge(3)])


def undeclared_member_is_named() -> None:
    """Compiled code calling an undeclared member gets the library's
    ``OpaqueMemberError`` (re-raised by Dynamo as its wrapper, message first);
    any other error propagates as it is."""
    from opaque_subclass import OpaqueMemberError

    try:
        compiled_undeclared_member()
    except Exception as error:
        if isinstance(error, OpaqueMemberError) or str(error).startswith("OpaqueMemberError: "):
            return
        raise
    raise AssertionError("compiled code using an undeclared member raised nothing")


#: torch without the member guard: the first gauge's factor() is served to the second.
MEMBER_UNGUARDED_FAILURE = StockFailure(AssertionError, r"^outputs \[3\.0, 3\.0\], expected \[3\.0, 5\.0\]$")


def _undeclared_member_failure() -> StockFailure:
    from torch._dynamo.exc import InternalTorchDynamoError

    return StockFailure(
        InternalTorchDynamoError,
        r"^UnsafeScriptObjectError: Attempted to access unregistered member on an OpaqueObject\n",
    )


#: torch's own error for an undeclared member (2.11 - 2.15 alike).
UNDECLARED_MEMBER_FAILURE = _undeclared_member_failure()


def program_on_groups_compiles_once() -> None:
    """A compiled program that reads nothing from its ``ProcessGroup``
    attribute, called with three groups of one size (fake process groups):
    one compilation, each output carrying its call's group."""
    import torch.distributed as dist
    from torch._dynamo.testing import CompileCounterWithBackend

    with fake_world(4) as world:
        groups = [world, dist.new_group([0, 1]), dist.new_group([0, 1])]
        counter = CompileCounterWithBackend("aot_eager")
        f = torch.compile(lambda t: t * 2, backend=counter, fullgraph=True)
        for g in groups:
            assert f(GroupTensor(torch.ones(1), g))._group is g
        assert counter.frame_count == 1, f"compiled {counter.frame_count} times for {len(groups)} groups"


def collectives_on_group_attribute() -> list[tuple[str, int]]:
    """Compiled code passing a subclass's ``ProcessGroup`` attribute to torch's
    functional collectives (``all_reduce``, ``all_gather_tensor``) and to
    ``dist.all_reduce``, over five calls with four distinct groups (fake
    process groups): outputs equal eager's, one compilation per group (torch
    guards the group's name, which the graph's collective names). Returns
    ``(program, compilations)`` per program."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch._dynamo.testing import CompileCounterWithBackend

    def inplace(t: torch.Tensor) -> torch.Tensor:
        data = t._data.clone()
        dist.all_reduce(data, group=t._group)
        return data * 2

    programs: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "all_reduce": lambda t: funcol.all_reduce(t._data, "sum", t._group) * 2,
        "all_gather_tensor": lambda t: funcol.all_gather_tensor(t._data, 0, t._group) * 2,
        "dist.all_reduce": inplace,
    }
    counts: list[tuple[str, int]] = []
    with fake_world(4) as world:
        groups = [world, dist.new_group([0, 1]), dist.new_group([0, 1]), dist.new_group([0, 1, 2, 3]), world]
        for name, fn in programs.items():
            torch._dynamo.reset()
            counter = CompileCounterWithBackend("aot_eager")
            compiled = torch.compile(fn, backend=counter, fullgraph=True)
            for g in groups:
                x = GroupTensor(torch.arange(1.0, 3.0), g)
                got, expected = compiled(x), fn(x)
                assert torch.equal(got, expected), f"{name}: {got} != eager {expected}"
            counts.append((name, counter.frame_count))
    return counts


def collectives_on_group_attribute_compile_per_group() -> None:
    counts = collectives_on_group_attribute()
    assert all(n == 4 for _, n in counts), f"compilations {counts}, expected 4 each"


#: torch 2.11 without the isinstance patch: the collective sees torch's fake
#: wrapper, not a ProcessGroup, and raises (traced) ValueError.
COLLECTIVE_GROUP_TYPE_FAILURE = StockFailure(
    torch._dynamo.exc.Unsupported,
    r"^Observed exception\n(.|\n)*raised exception ValueError\(.*'Unsupported group type: '.*FakeScriptObject",
)


def dtensor_outputs_on_runtime_mesh(backend: str = "aot_eager") -> None:
    """A compiled ``t * 2`` called with DTensors on 16 different ``DeviceMesh``
    objects over the same 4 ranks (fake process groups; ``DeviceMesh``
    registered as a reference opaque, as torch 2.12+ does itself): each output
    on its call's mesh, and one compilation, as on torch 2.13 (the meshes
    compare equal). Stock torch 2.11 returns 15 of the 16 on the first call's
    mesh, which its flatten context compiled in."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    import opaque_subclass

    with fake_world(4):
        opaque_subclass.register_opaque(DeviceMesh)
        meshes = [DeviceMesh("cpu", torch.arange(4)) for _ in range(16)]
        counter = CompileCounterWithBackend(backend)
        f = torch.compile(lambda t: t * 2, backend=counter, fullgraph=True)
        outs = [f(DTensor.from_local(torch.arange(2.0), m, [Shard(0)])) for m in meshes]
        for out in outs:
            assert torch.equal(out.to_local(), torch.arange(2.0) * 2), out.to_local()
        stale = sum(out.device_mesh is not m for out, m in zip(outs, meshes, strict=True))
        assert stale == 0, f"{stale} of {len(meshes)} outputs carry another call's mesh"
        assert counter.frame_count == 1, f"compiled {counter.frame_count} times for {len(meshes)} meshes"


def dtensor_handlers_take_registered_mesh() -> None:
    """``DTensor.from_local`` and ``DTensor.redistribute`` given a registered
    ``DeviceMesh`` that is a graph input (an argument here; in tensor-parallel
    code, the mesh a ``parallelize_module`` hook closes over), and the mesh of
    the DTensor they return read in compiled code, called with two meshes of
    equal content (fake process groups): results equal eager's, one
    compilation."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate

    import opaque_subclass

    def f(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        d = DTensor.from_local(t, mesh, [Replicate()])
        e = d.redistribute(mesh, [Replicate()])
        return e.to_local() * 2 * e.device_mesh.ndim  # the mesh of a DTensor computed in the graph

    with fake_world(4):
        opaque_subclass.register_opaque(DeviceMesh)
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(f, backend=counter, fullgraph=True)
        for _ in range(2):
            mesh = DeviceMesh("cpu", torch.arange(4))
            got, expected = compiled(torch.arange(2.0), mesh), f(torch.arange(2.0), mesh)
            assert torch.equal(got, expected), f"{got} != eager {expected}"
        assert counter.frame_count == 1, f"compiled {counter.frame_count} times for 2 meshes"


#: torch 2.11 without the patch of Dynamo's ``from_local``/``redistribute``
#: handler: the handler asks the mesh's opaque variable for a constant.
DTENSOR_MESH_CONSTANT_FAILURE = StockFailure(
    torch._dynamo.exc.InternalTorchDynamoError,
    r"^AsPythonConstantNotImplementedError: TorchScriptObjectVariable\(FakeScriptObject\) is self-referential\n",
)


def dtensor_runtime_meshes_per_program(programs: int = 3, requires_grad: bool = False) -> list[dict[str, int]]:
    """``programs`` DTensor programs run one after the other in this process,
    each on its own fake process group of 8 ranks after ``torch._dynamo.reset()``,
    each compiling ``t * 2`` (aot_eager) and calling it with DTensors
    (``Replicate``) on 4 new ``DeviceMesh`` objects over the 8 ranks. Per program:
    how many outputs carry a mesh other than their input's (``stale``), and the
    number of compilations. With ``requires_grad``, each call's gradient is taken
    too, and ``stale_grads`` counts the gradients the compiled backward returns
    (read by a hook on the input, before autograd accumulates them into
    ``.grad``: accumulating clones a gradient in eager DTensor, whose sharding
    cache may hand back an equal earlier mesh, as for any eager DTensor op).

    DTensor's sharding propagation caches output specs by mesh equality, so
    while a later program is traced its output's spec holds an earlier
    program's (equal) mesh; torch 2.12 - 2.15 compile that mesh in (4 stale
    outputs per later program) and, with ``requires_grad``, fail to compile.
    """
    import torch.distributed as dist
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    import opaque_subclass

    results = []
    for _ in range(programs):
        torch._dynamo.reset()
        with fake_world(8):
            opaque_subclass.register_opaque(DeviceMesh)
            counter = CompileCounterWithBackend("aot_eager")
            f = torch.compile(lambda t: t * 2, backend=counter, fullgraph=True)
            stale = stale_grads = 0
            for _ in range(4):
                mesh = DeviceMesh.from_group(dist.new_group(list(range(8))), "cpu")
                x = distribute_tensor(torch.ones(4), mesh, [Replicate()])
                grads: list[torch.Tensor] = []
                if requires_grad:
                    x.requires_grad_(True)
                    x.register_hook(grads.append)
                out = f(x)
                stale += out.device_mesh is not mesh
                if requires_grad:
                    out.to_local().sum().backward()
                    stale_grads += grads[0].device_mesh is not mesh
            result = {"stale": stale, "compilations": counter.frame_count}
            if requires_grad:
                result["stale_grads"] = stale_grads
            results.append(result)
    torch._dynamo.reset()
    return results


def dtensor_programs_keep_runtime_meshes() -> None:
    """Two DTensor programs in one process (see
    :func:`dtensor_runtime_meshes_per_program`): every output of each on the
    mesh passed in, one compilation each."""
    for i, result in enumerate(dtensor_runtime_meshes_per_program(2)):
        assert result["stale"] == 0, f"program {i}: {result['stale']} of 4 outputs carry an earlier program's mesh"
        assert result["compilations"] == 1, f"program {i}: compiled {result['compilations']} times"


#: torch 2.12 - 2.15 without the ``get_proxy_slot`` fix: a program traced while
#: DTensor's sharding cache holds an equal mesh of an earlier program (the first
#: program in a fresh process, the second otherwise) compiles that mesh in.
DTENSOR_CACHED_MESH_FAILURE = StockFailure(
    AssertionError, r"^program [01]: 4 of 4 outputs carry an earlier program's mesh$"
)


def compile_raises_the_librarys_error() -> None:
    """``torch.compile`` of a subclass argument that lists an ``int``: the
    library's ``OpaqueTypeError`` reaches the caller as itself, naming the
    argument's path (issue #24)."""
    import opaque_subclass

    x = MeshTensor(torch.ones(2), Mesh("bad"))
    x._mesh = 3  # type: ignore[assignment]  # an int where an opaque is listed
    f = torch.compile(lambda t: t + 1, backend="aot_eager", fullgraph=True)
    try:
        f(x)
    except opaque_subclass.OpaqueTypeError as e:
        assert "(path \"L['t']._mesh\"), which holds int" in str(e), str(e)
        return
    raise AssertionError("compiling a subclass argument that lists an int raised nothing")


#: torch without the fix of ``torch._dynamo.convert_frame._compile`` (2.11 -
#: 2.15 alike): Dynamo re-raises the library's error as its internal error.
LIBRARY_ERROR_WRAPPED_FAILURE = StockFailure(
    torch._dynamo.exc.InternalTorchDynamoError,
    r"^OpaqueTypeError: 'int' found in tensor attrs of MeshTensor\.__tensor_flatten__\(\)\. Only tensors and "
    r"reference-type opaques are allowed in tensor attrs\. subclasses\.MeshTensor\.__tensor_flatten__\(\) lists "
    r"attribute '_mesh' \(path \"L\['t'\]\._mesh\"\), which holds int\.",
)


def backward_refuses_a_tangent_listing_other_attributes() -> None:
    """A compiled backward given a tangent whose ``__tensor_flatten__`` lists
    other attributes than its forward output (same flatten context): the
    library's ``OpaqueTypeError`` naming what it lists, never the gradient read
    at the output's names (issue #24)."""
    import opaque_subclass

    f = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
    x = Listing(torch.ones(2), ["_data", "_a"], _a=Mesh("a")).requires_grad_()
    tangent = Listing(torch.ones(2), ["_data", "_b"], _a=Mesh("stale"), _b=Mesh("b"))
    try:
        f(x).backward(tangent)
    except opaque_subclass.OpaqueTypeError as e:
        assert "lists ['_data', '_b'], but the forward output" in str(e), str(e)
        return
    grad = x.grad
    raise AssertionError(
        f"backward read a tangent listing ['_data', '_b'] at the output's names: the gradient lists "
        f"{grad._names} holding {[getattr(grad, n) for n in grad._names[1:]]}"
    )


#: Stock torch: the gradient carries the tangent's stale ``_a`` (eager gives its ``_b``).
TANGENT_LIST_FAILURE = StockFailure(
    AssertionError,
    r"^backward read a tangent listing \['_data', '_b'\] at the output's names: the gradient lists "
    r"\['_data', '_a'\] holding \[Mesh\('a'\)\]",
)


def compile_takes_an_opaque_answering_every_name() -> None:
    """``torch.compile`` of a subclass holding an opaque whose ``__getattr__``
    answers every name: a graph input like any opaque, the output holds the
    call's own object (issue #24)."""
    f = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
    for name in ("one", "two"):
        obj = Anything(name)
        assert f(MeshTensor(torch.ones(2), obj))._mesh is obj


#: Stock torch takes it for a TorchScript object tracing with real values.
ANSWERING_OPAQUE_FAILURE = StockFailure(
    AssertionError, r"^tracing_mode can be either real or fake but got Anything\('one'\)"
)


def parametrization_names_a_deleted_opaque_leaf() -> None:
    """``del module.parametrizations.w.original1`` (the opaque leaf stored by
    ``unwrap_subclass_parameters``), then ``module.w``: the library's
    error names the leaf and the opaque's attribute, not the property (issue #24)."""
    import opaque_subclass as osc

    module = torch.nn.Module()
    module.w = torch.nn.Parameter(MeshTensor(torch.ones(2), Mesh("w")), requires_grad=False)
    osc.unwrap_subclass_parameters(module)
    del module.parametrizations.w.original1
    with pytest.raises(osc.OpaqueSubclassError, match=r"module\.parametrizations\.w\.original1, the opaque"):
        _ = module.w


#: Stock torch: the leaf's AttributeError is raised inside the property ``w``, so
#: Python reports the property itself missing.
DELETED_LEAF_FAILURE = StockFailure(AttributeError, r"^'ParametrizedModule' object has no attribute 'w'$")


def meshes_of_one_shape_compile_once() -> None:
    """Four 4-rank ``DeviceMesh`` objects over other ranks (a fake world of
    16), held by a subclass whose compiled program reads nothing of the ranks:
    one compilation, each output on its own mesh (issue #25, one compilation
    per mesh shape)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.distributed.device_mesh import DeviceMesh

    with fake_world(16):
        meshes = [DeviceMesh("cpu", ranks) for ranks in ([0, 1, 2, 3], [4, 0, 5, 6], [0, 7, 8, 9], [10, 0, 11, 12])]
        counter = CompileCounterWithBackend("aot_eager")
        f = torch.compile(lambda t: t * 2, backend=counter, fullgraph=True)
        outs = [f(MeshTensor(torch.ones(2), m)) for m in meshes]
        assert all(o._mesh is m for o, m in zip(outs, meshes, strict=True)), "an output carries another mesh"
        assert counter.frame_count == 1, f"compilations: {counter.frame_count}"


MESH_RECOMPILED_FAILURE = StockFailure(AssertionError, r"^compilations: 4$")


def frames_started(step: Callable[[], object], *names: str) -> dict[str, int]:
    """How many Python frames of each function named in ``names`` start during ``step()``."""
    import sys

    seen = dict.fromkeys(names, 0)

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in seen:
            seen[frame.f_code.co_name] += 1

    sys.setprofile(profiler)
    try:
        step()
    finally:
        sys.setprofile(None)
    return seen


def python_flatten_calls_per_input(compiled_code: Any) -> int:
    """How many Python guards calling ``__tensor_flatten__`` each subclass input of the
    compiled function got: torch's context check (``___check_metadata_...``) and
    attribute-list check (``...__tensor_flatten__()[0] == [...]``), counted in the
    printed guard tree of its first cache entry, per input ``L['xs'][i]``."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    tree = str(_debug_get_cache_entry_list(compiled_code)[0].guard_manager)
    inputs = len(re.findall(r"source=L\['xs'\]\[\d+\], ", tree))
    calls = len(re.findall(r"LAMBDA_GUARD: ___check_metadata_", tree)) + len(
        re.findall(r"EQUALS_MATCH: L\['xs'\]\[\d+\]\.__tensor_flatten__\(\)\[0\] == ", tree)
    )
    return calls // max(inputs, 1)


def constant_flatten_guarded_once_per_class() -> None:
    """Three inputs of a subclass whose ``__tensor_flatten__`` returns constants
    (``ConstantMeshTensor``): no Python guard calls ``__tensor_flatten__`` per input;
    new instances on new meshes reuse the compilation and carry their own mesh (issue
    #39, Dynamo's guards on subclass inputs)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def fn(*xs: Any) -> list[Any]:
        return [x + 1 for x in xs]

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    for call in range(2):
        meshes = [Mesh(f"m{call}{i}") for i in range(3)]
        outs = compiled(*(ConstantMeshTensor(torch.ones(2), m) for m in meshes))
        assert [o._mesh for o in outs] == meshes and all(o._mesh is m for o, m in zip(outs, meshes, strict=True))
        assert torch.equal(outs[0]._data, torch.full((2,), 2.0))
    assert counter.frame_count == 1, f"compilations: {counter.frame_count}"
    calls = python_flatten_calls_per_input(fn.__code__)
    assert calls == 0, f"Python flatten calls in the guards per input: {calls}"


FLATTEN_GUARDED_PER_INPUT_FAILURE = StockFailure(AssertionError, r"^Python flatten calls in the guards per input: 1$")


def gradients_rebuilt_by_generated_code() -> None:
    """A compiled forward and backward on two ``MeshTensor`` inputs: no gradient is
    rebuilt by torch's generic ``SubclassCreationMeta.creation_fn`` walk (torch 2.11
    runs it per subclass on every backward; 2.12+ generate the backward wrapper), and
    each gradient holds its input's mesh (issue #39, per call on every release)."""
    compiled = torch.compile(lambda a, b: (a * 2, b + 1), backend="aot_eager", fullgraph=True)
    walks = 0
    for call in range(2):
        xs = [MeshTensor(torch.randn(3), Mesh(f"x{call}")).requires_grad_() for _ in range(2)]
        outs = compiled(*xs)
        tangents = [MeshTensor(torch.ones(3), Mesh("t")) for _ in range(2)]
        grads: list[Any] = []
        walks += frames_started(
            lambda g=grads, o=outs, i=xs, t=tangents: g.extend(torch.autograd.grad(o, i, t)), "creation_fn"
        )["creation_fn"]
        assert all(type(g) is MeshTensor and g._mesh is x._mesh for g, x in zip(grads, xs, strict=True))
        assert torch.equal(grads[0]._data, torch.full((3,), 2.0)) and torch.equal(grads[1]._data, torch.ones(3))
    assert walks == 0, f"gradients rebuilt by creation_fn: {walks}"


GENERIC_GRADIENT_WALK_FAILURE = StockFailure(AssertionError, r"^gradients rebuilt by creation_fn: 4$")


def saved_opaques_checked_once_per_class() -> None:
    """A compiled forward and backward on three ``MeshTensor`` inputs saves their meshes for
    the backward: after the first call, no forward asks torch's registry whether a saved
    mesh's class is registered (torch's ``is_opaque_type``, 2.14+ ``is_custom_class``, per
    saved opaque on every call), and every gradient holds its input's mesh (issue #39)."""
    compiled = torch.compile(lambda *xs: [x * 2 for x in xs], backend="aot_eager", fullgraph=True)
    asked = 0
    for call in range(3):
        xs = [MeshTensor(torch.randn(3), Mesh(f"s{call}{i}")).requires_grad_() for i in range(3)]
        outs: list[Any] = []
        seen = frames_started(lambda o=outs, i=xs: o.extend(compiled(*i)), "is_opaque_type", "is_custom_class")
        if call:
            asked += sum(seen.values())
        grads = torch.autograd.grad(outs, xs, [MeshTensor(torch.ones(3), x._mesh) for x in xs])
        assert all(type(g) is MeshTensor and g._mesh is x._mesh for g, x in zip(grads, xs, strict=True))
        assert all(torch.equal(g._data, torch.full((3,), 2.0)) for g in grads)
    assert asked == 0, f"registry checks of saved opaques in two forwards: {asked}"


SAVED_OPAQUE_CHECK_FAILURE = StockFailure(AssertionError, r"^registry checks of saved opaques in two forwards: 6$")


def saved_values_passed_without_a_walk() -> None:
    """A compiled forward and backward on three ``MeshTensor`` inputs: no backward walks the
    values its forward saved (tensors and the meshes) with torch 2.11's
    ``subclass_utils.runtime_unwrap_tensor_subclasses``, one ``is_traceable_wrapper_subclass``
    call per value (torch 2.12+ generate ``list(args)`` for this step), and every gradient holds
    its input's mesh (issue #39)."""
    compiled = torch.compile(lambda *xs: [x * x for x in xs], backend="aot_eager", fullgraph=True)
    walks = 0
    for call in range(2):
        xs = [MeshTensor(torch.full((3,), float(i + 1)), Mesh(f"w{call}{i}")).requires_grad_() for i in range(3)]
        outs = compiled(*xs)
        tangents = [MeshTensor(torch.ones(3), x._mesh) for x in xs]
        grads: list[Any] = []
        walks += runs_of_torch_function(
            lambda g=grads, o=outs, i=xs, t=tangents: g.extend(torch.autograd.grad(o, i, t)),
            "runtime_unwrap_tensor_subclasses",
            "_aot_autograd/subclass_utils.py",
        )
        assert all(type(g) is MeshTensor and g._mesh is x._mesh for g, x in zip(grads, xs, strict=True))
        assert all(torch.equal(g._data, torch.full((3,), 2.0 * (i + 1))) for i, g in enumerate(grads))
    assert walks == 0, f"walks of saved values in two backwards: {walks}"


SAVED_VALUES_WALK_FAILURE = StockFailure(AssertionError, r"^walks of saved values in two backwards: 4$")


def mesh_read_below_dynamo_keeps_its_guard() -> None:
    """A subclass's dispatch reads its mesh's coordinate while AOTAutograd
    traces (``CoordinateShifted``): each rank map compiles anew and every call
    adds its own coordinate (0, 1, 0, 1), never the first mesh's (issue #25)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.distributed.device_mesh import DeviceMesh

    with fake_world(16):
        meshes = [DeviceMesh("cpu", ranks) for ranks in ([0, 1, 2, 3], [4, 0, 5, 6], [0, 7, 8, 9], [10, 0, 11, 12])]
        counter = CompileCounterWithBackend("aot_eager")
        f = torch.compile(lambda t: t * 2, backend=counter, fullgraph=True)
        values = [float(f(CoordinateShifted(torch.zeros(2), m))._data[0]) for m in meshes]
        assert values == [0.0, 1.0, 0.0, 1.0], f"coordinates compiled in: {values}"


MESH_READ_UNSEEN_FAILURE = StockFailure(AssertionError, r"^coordinates compiled in: \[0\.0, 0\.0, 0\.0, 0\.0\]$")


def runs_of_torch_function(step: Callable[[], object], name: str, module_file: str) -> int:
    """How often the body of torch's function ``name``, defined in the torch file ending with
    ``module_file`` (``"_aot_autograd/runtime_wrappers.py"``), runs during ``step()``: torch's
    own, not a replacement of the same name defined elsewhere."""
    import sys

    count = 0

    def profiler(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        code = frame.f_code
        if event == "call" and code.co_name == name and code.co_filename.replace("\\", "/").endswith(module_file):
            count += 1

    sys.setprofile(profiler)
    try:
        step()
    finally:
        sys.setprofile(None)
    return count


def runs_of_torchs_tangent_function(step: Callable[[], object]) -> int:
    """How often torch's own ``AOTDispatchAutograd.process_runtime_tangent`` body runs during
    ``step()`` (the library's fix reads a tangent that needs nothing from torch without it)."""
    return runs_of_torch_function(step, "process_runtime_tangent", "_aot_autograd/runtime_wrappers.py")


@contextlib.contextmanager
def fresh_inductor_cache() -> Iterator[str]:
    """A fresh ``TORCHINDUCTOR_CACHE_DIR`` for the block (an entry an earlier
    run wrote is never served; torch's caches stay on), the previous value put
    back and the directory removed after it."""
    import os
    import shutil
    import tempfile

    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    fresh = tempfile.mkdtemp(prefix="opaque-subclass-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh
    try:
        yield fresh
    finally:
        if previous is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
        shutil.rmtree(fresh, ignore_errors=True)


@contextlib.contextmanager
def inductor_metrics_log_on() -> Iterator[None]:
    """Inductor's metrics log at INFO for the block (as ``TORCH_LOGS=inductor_metrics``): inductor
    then counts the bytes of every buffer of the graphs it compiles. Its level put back after."""
    import logging

    metrics = logging.getLogger("torch._inductor.compile_fx.__inductor_metrics")
    level = metrics.level
    metrics.setLevel(logging.INFO)
    try:
        yield
    finally:
        metrics.setLevel(level)


#: The process group :class:`_SummedBelowDynamo` sums over (set by the scenario, per rank).
_SUMMED_GROUP: list[Any] = []


class _SummedBelowDynamo(torch.Tensor):
    """Sums every result over the group in ``_SUMMED_GROUP`` in ``__torch_dispatch__``:
    a collective issued while AOTAutograd traces, its group named by a constant in
    the graph and absent from Dynamo's graph (so from AOTAutograd's cache key)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data: torch.Tensor) -> None:
        self._data = data

    def __repr__(self) -> str:  # torch's would print the values (a data-dependent read while tracing)
        return f"_SummedBelowDynamo(shape={tuple(self.shape)})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return _SummedBelowDynamo(inner["_data"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import torch.distributed._functional_collectives as funcol
        from torch.utils._pytree import tree_map_only

        unwrap = lambda t: t._data  # noqa: E731
        out = func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs or {}))
        out = tree_map_only(torch.Tensor, lambda r: funcol.all_reduce(r, "sum", _SUMMED_GROUP[0]), out)
        return tree_map_only(torch.Tensor, cls, out)


def no_rank_loads_another_groups_entry() -> dict[int, str]:
    """Three ranks of a 4-rank job (fake process groups, one after the other in
    this process, one cache directory), each creating the job's groups [0, 1]
    and [2, 3] in order, compile ``t * 2`` of a tensor whose dispatch sums over
    its rank's group (inductor): rank 0 compiles; rank 2, whose group is
    another, must not get rank 0's AOTAutograd entry (its graph names group
    '1', of which rank 2 is no member) and compiles its own; rank 1, in rank
    0's group, gets rank 0's entry. Returns each rank's cache use."""
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    use: dict[int, str] = {}
    with fresh_inductor_cache():
        for rank in (0, 2, 1):
            with fake_world(4, rank):
                groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
                _SUMMED_GROUP[:] = [groups[rank // 2]]
                torch._dynamo.reset()
                hits = counters["aot_autograd"]["autograd_cache_hit"]
                f = torch.compile(lambda t: t * 2, backend="inductor", fullgraph=True)
                try:
                    out = f(_SummedBelowDynamo(torch.ones(2)))
                except RuntimeError as e:
                    raise AssertionError(f"rank {rank} ran another rank's entry: {str(e).splitlines()[0]}") from e
                assert torch.equal(out._data, torch.full((2,), 2.0)), out._data
                use[rank] = "hit" if counters["aot_autograd"]["autograd_cache_hit"] > hits else "miss"
    _SUMMED_GROUP.clear()
    assert use == {0: "miss", 2: "miss", 1: "hit"}, f"AOTAutograd cache use per rank: {use}"
    return use


ANOTHER_GROUPS_ENTRY_FAILURE = StockFailure(
    AssertionError, r"^rank 2 ran another rank's entry: Could not resolve the process group registered under the name"
)
ENTRY_GUARD_UNREAD_FAILURE = StockFailure(
    AssertionError, r"^AOTAutograd cache use per rank: \{0: 'miss', 2: 'miss', 1: 'miss'\}$"
)


def _compiled_under_share_compiles(fn: Callable[[object], torch.Tensor], x: object) -> torch.Tensor:
    """``fn(x)`` compiled with inductor under ``share_compiles`` in a fresh
    compile-cache directory (an entry an earlier run wrote is never served)."""
    from opaque_subclass.dtensor import share_compiles

    with fresh_inductor_cache():
        torch._dynamo.reset()
        with share_compiles():
            return torch.compile(fn, fullgraph=True)(x)


def _refused_naming(member: str, fn: Callable[[object], torch.Tensor], x: object) -> None:
    from opaque_subclass.dtensor import ShareCompilesError

    try:
        out = _compiled_under_share_compiles(fn, x)
    except ShareCompilesError as e:
        assert f"): {member}." in str(e), str(e)
        return
    raise AssertionError(f"compiled with this rank's part: {out.tolist()}")


def share_compiles_refuses_the_chunk_of_an_output() -> None:
    """Under ``share_compiles``, a Replicate -> Shard redistribution of an
    operator's output (``t * 2``, whose spec DTensor's sharding cache gives the
    real mesh) picks this rank's chunk through the real mesh's
    ``_sym_get_coordinate``: refused with the library's error naming it, never
    compiled with this rank's chunk for the other ranks to load."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    with fake_world(4):
        mesh = DeviceMesh("cpu", [1, 0, 2, 3])  # rank 0 is at position 1
        x = DTensor.from_local(torch.arange(8.0), mesh, [Replicate()], run_check=False)
        _refused_naming("_sym_get_coordinate", lambda t: (t * 2).redistribute(t.device_mesh, [Shard(0)]).to_local(), x)


SHARED_CHUNK_FAILURE = StockFailure(AssertionError, r"^compiled with this rank's part: \[4\.0, 6\.0\]$")


_NEW_SHARD_DIM_RUNS: list[None] = []


def share_compiles_refuses_the_new_shard_dim_of_an_output() -> None:
    """As :func:`share_compiles_refuses_the_chunk_of_an_output` for Shard(0) ->
    Shard(1) of an operator's output, which reads the real mesh's
    ``get_coordinate()`` and indexes it."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    _NEW_SHARD_DIM_RUNS.append(None)
    with fake_world(8):
        # rank 0 at position 1; ranks no earlier run had: DTensor caches its collectives' groups by mesh equality
        mesh = DeviceMesh("cpu", [len(_NEW_SHARD_DIM_RUNS) % 7 + 1, 0])
        x = DTensor.from_local(torch.arange(4.0).reshape(2, 2), mesh, [Shard(0)], run_check=False)
        _refused_naming("get_coordinate", lambda t: (t * 2).redistribute(t.device_mesh, [Shard(1)]).to_local(), x)


SHARED_NEW_SHARD_DIM_FAILURE = StockFailure(AssertionError, r"^compiled with this rank's part: \[")


#: The xdist group of the tests that read :func:`shared_chunk_job` (one worker runs them, so the
#: job runs once per test session instead of once per test).
SHARED_CHUNK_JOB_GROUP = "shared-chunk-job"


@functools.cache
def shared_chunk_job() -> tuple[dict[str, Any], ...]:
    """Each rank's ``tests/dist_workers.py:shared_chunk_step`` result in a simulated job of two
    ranks (one process each, fake process group, one shared compile-cache directory), in rank
    order. The job is the same for every reader (tests/test_dtensor_share.py and the conformance
    entry ``dtensor/share-compiles-job-of-two-ranks``), so it runs once per process."""
    from pathlib import Path

    from opaque_subclass.testing import simulate_job

    workers = Path(__file__).with_name("dist_workers.py")
    with tempfile.TemporaryDirectory(prefix="opaque-subclass-job-") as cache:
        report = simulate_job(f"{workers}:shared_chunk_step", 2, ranks=[0, 1], cache_dir=cache)
    return tuple(r.value for r in report.ranks)
