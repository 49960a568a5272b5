"""DTensor code compiles and runs the same with ``DeviceMesh`` registered as a
reference opaque (gloo, world size 1, 127.0.0.1; fake process groups; 4 gloo
processes for FSDP2 + tensor parallelism), on every leg.

A DTensor lists its mesh among its flatten attributes (torch 2.12+ natively;
torch 2.11 through ``backport/dtensor.py``), so compiled code returns
DTensors on the mesh passed in at run time. DTensor's own code in Dynamo 2.11
needs its mesh as a compile-time constant: before the fix,
``x.redistribute(x.device_mesh, ...)`` and ``DTensor.from_local(...,
x.device_mesh, ...)`` failed with "TorchScriptObjectVariable(FakeScriptObject)
is self-referential".
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from scenarios import (
    StockFailure,
    assert_fails_as,
    dtensor_handlers_take_registered_mesh,
    dtensor_outputs_on_runtime_mesh,
)
from subclasses import registered_mesh_world_of_one

import opaque_subclass
from opaque_subclass.testing import run_local_workers, warm

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this build")


# Tests on fake process groups first: the module's gloo group (the fixture below)
# stays the default group until the module ends.


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_outputs_on_the_mesh_passed_in(backend):
    """16 meshes over the same ranks: each output on its call's mesh, one
    compilation (as torch 2.13 measures). In a fresh process, so that no
    earlier DTensor program has filled DTensor's sharding cache (later
    programs: test_later_programs_get_their_own_meshes)."""
    import sys

    code = f"from scenarios import dtensor_outputs_on_runtime_mesh as s; s({backend!r}); print('OK')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])}
    out = warm.run([sys.executable, "-c", code], timeout=300, env=env)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


@pytest.mark.skipif(opaque_subclass.support().mode != "backport", reason="torch 2.11 backport only")
def test_stock_torch_2_11_returns_the_first_calls_mesh():
    """Without the patched ``DTensor.__tensor_flatten__`` (stock torch 2.11),
    the mesh is compiled in: 15 of the 16 outputs carry the first call's mesh
    (16 after an earlier run of the scenario in this process)."""
    from opaque_subclass.activation import BACKPORT as PATCH_SET

    torch._dynamo.reset()
    try:
        with PATCH_SET.suspended("torch.distributed.tensor._api.DTensor.__tensor_flatten__"):
            assert_fails_as(
                dtensor_outputs_on_runtime_mesh,
                StockFailure(AssertionError, r"^1[56] of 16 outputs carry another call's mesh$"),
            )
    finally:
        torch._dynamo.reset()


def test_from_local_and_redistribute_take_a_registered_mesh():
    torch._dynamo.reset()
    try:
        dtensor_handlers_take_registered_mesh()
    finally:
        torch._dynamo.reset()


def test_fsdp2_with_tensor_parallel_compiled_equals_eager_and_stock():
    """FSDP2 + tensor parallelism on a 2x2 (dp, tp) mesh, 4 gloo processes,
    3 SGD steps under torch.compile: the losses equal eager's and stock
    torch's (the library disabled), and DTensor lists its mesh."""
    workers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_workers.py")
    results = run_local_workers(f"{workers}:fsdp2_tp_train", 4, timeout=240.0)
    assert len(results) == 4, results
    for r in results:
        assert r["mesh_listed"] is True and r["weight_mesh_ndim"] == 2, r
        assert len(r["eager"]) == 3, r
        for eager, stock, compiled in zip(r["eager"], r["compiled_stock"], r["compiled"], strict=True):
            assert abs(eager - compiled) <= 1e-5 * max(1.0, abs(eager)), r
            assert compiled == stock, r


@pytest.fixture(scope="module")
def mesh():
    with registered_mesh_world_of_one() as device_mesh:
        yield device_mesh


def _redistribute_and_rebuild(x):
    from torch.distributed.tensor import DTensor, Replicate

    y = x.redistribute(x.device_mesh, [Replicate()])
    return DTensor.from_local(y.to_local() * 2, x.device_mesh, [Replicate()]).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dtensor_forward_backward_redistribute_from_local(mesh, backend):
    from torch.distributed.tensor import Shard, distribute_tensor

    torch._dynamo.reset()
    f = torch.compile(_redistribute_and_rebuild, backend=backend, fullgraph=True)
    x = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]).requires_grad_(True)
    out = f(x)
    out.backward()
    ref_x = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]).requires_grad_(True)
    ref = _redistribute_and_rebuild(ref_x)
    ref.backward()
    torch._dynamo.reset()
    assert torch.equal(out.full_tensor(), ref.full_tensor())
    assert torch.equal(x.grad.full_tensor(), ref_x.grad.full_tensor())
    assert x.grad.device_mesh is mesh


def test_dtensor_to_local_and_mesh_as_argument(mesh):
    """A mesh passed as an argument next to a DTensor: both uses compile."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    def g(x, m):
        return DTensor.from_local(x.to_local() + 1, x.device_mesh, [Replicate()]), m

    torch._dynamo.reset()
    f = torch.compile(g, backend="aot_eager", fullgraph=True)
    x = distribute_tensor(torch.ones(2), mesh, [Shard(0)])
    out, got = f(x, mesh)
    torch._dynamo.reset()
    assert got is mesh and torch.equal(out.to_local(), torch.full((2,), 2.0))


def _runtime_meshes_in_fresh_process(arguments: str) -> list[dict[str, int]]:
    """:func:`scenarios.dtensor_runtime_meshes_per_program` run in a fresh
    process (DTensor's sharding cache empty) with an empty compile cache."""
    import json
    import shutil
    import sys
    import tempfile

    tests = os.path.dirname(os.path.abspath(__file__))
    code = f"import json, scenarios as s; print(json.dumps(s.dtensor_runtime_meshes_per_program({arguments})))"
    cache = tempfile.mkdtemp(prefix="opaque-subclass-dtensor-")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([tests, os.path.dirname(tests), *sys.path]),
        "TORCHINDUCTOR_CACHE_DIR": cache,
    }
    try:
        out = warm.run([sys.executable, "-c", code], timeout=300, env=env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_later_programs_get_their_own_meshes():
    """Three DTensor programs in one process, each on fresh meshes: every
    output on its call's mesh, one compilation each. Stock torch 2.12 - 2.15
    give [0, 4, 4] stale outputs (DTensor's sharding cache hands the tracer an
    equal mesh of the first program, compiled in); the fix
    ``torch.fx.experimental.proxy_tensor.get_proxy_slot`` (and on 2.11 the
    backport's patch of it) makes it the input's mesh."""
    results = _runtime_meshes_in_fresh_process("3")
    assert [r["stale"] for r in results] == [0, 0, 0], results
    assert [r["compilations"] for r in results] == [1, 1, 1], results


def test_later_programs_with_gradients_compile_and_get_their_own_meshes():
    """The same with gradients: stock torch 2.12 - 2.15 fail to compile the
    second program (the cached mesh matches a tangent placeholder: "Node
    tangents_2 was invalid, but is output"). The gradients the compiled
    backward returns are on the call's mesh; ``x.grad`` itself may carry an
    equal earlier mesh, because autograd clones a gradient when it
    accumulates it, in eager DTensor (torch's design, every release)."""
    results = _runtime_meshes_in_fresh_process("2, requires_grad=True")
    assert [(r["stale"], r["stale_grads"], r["compilations"]) for r in results] == [(0, 0, 1), (0, 0, 1)], results
