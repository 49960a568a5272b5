"""ShardedTensor: construction, errors, ops, collectives and torch.compile.

Most tests run in this process on a gloo group of world size 1 (127.0.0.1);
numerics with real shards run in 2 local processes (``two_ranks``), each
compared with plain tensors on the full values.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch._functorch.config
import torch.distributed as dist
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import opaque_subclass as osc
from opaque_subclass import OpaqueSubclassError
from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.sharded import tensor as sharded
from opaque_subclass.testing import OpaqueSubclassContract, run_local_workers

ShardedTensor = sharded.ShardedTensor
DeviceMesh = sharded.DeviceMesh


class _State:
    mesh: Any = None


@pytest.fixture(scope="module", autouse=True)
def mesh():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        _State.mesh = init_device_mesh("cpu", (1,))
        yield _State.mesh
    finally:
        _State.mesh = None
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _other_mesh() -> DeviceMesh:
    return DeviceMesh.from_group(dist.new_group([0]), "cpu")


# ---------------------------------------------------------------- contract


class TestShardedContract(OpaqueSubclassContract):
    SUBCLASS = ShardedTensor
    FACTORY = staticmethod(lambda: ShardedTensor.from_full(torch.randn(4, 2), _State.mesh, 0))


class TestReplicatedContract(OpaqueSubclassContract):
    SUBCLASS = ShardedTensor
    FACTORY = staticmethod(lambda: ShardedTensor.from_full(torch.randn(3), _State.mesh, None))


# ---------------------------------------------------------------- construction


def test_device_mesh_is_a_reference_opaque():
    assert osc.opaque_kind(DeviceMesh) == "reference"


def test_construction_and_flatten(mesh):
    x = ShardedTensor(torch.randn(2, 3), mesh, 1)
    assert x.shape == (2, 3) and x.mesh is mesh and x.shard_dim == 1 and x.num_shards() == 1
    assert x.__tensor_flatten__() == (["_local", "_mesh"], (1,))
    assert repr(x) == "ShardedTensor(shape=(2, 3), dtype=torch.float32, _mesh=DeviceMesh, _shard_dim=1)"
    leaves, spec = osc.flatten_subclass(x)
    assert leaves[1] is mesh
    y = osc.unflatten_subclass(leaves, spec)
    assert y._mesh is mesh and y.shard_dim == 1 and torch.equal(y.local_tensor(), x.local_tensor())


def test_global_shape_from_outer_size(mesh):
    x = ShardedTensor(torch.randn(2, 3), mesh, 0, outer_size=(4, 3))
    assert x.shape == (4, 3) and x.num_shards() == 2
    assert (x * 2).shape == (4, 3) and (x * 2).local_tensor().shape == (2, 3)
    assert x.t().shape == (3, 4) and x.t().shard_dim == 1 and x.t().stride() == (1, 3)


@pytest.mark.parametrize(
    "make, exc, message",
    [
        (
            lambda m: ShardedTensor(torch.ones(2, 3), m, -1),
            ValueError,
            "ShardedTensor._shard_dim is -1, outside [0, 2) for a 2-d shard. Fix: pass 1.",
        ),
        (
            lambda m: ShardedTensor(torch.ones(2, 3), m, 2),
            ValueError,
            "Fix: pass a dim in range, or None for replicated",
        ),
        (
            lambda m: ShardedTensor(torch.ones(2), m, "0"),
            TypeError,
            "ShardedTensor._shard_dim must be an int or None (replicated), got str. Fix: pass the dim as an int, e.g. 0.",
        ),
        (lambda m: ShardedTensor(torch.ones(0, 2), m, 0), ValueError, "empty shards are not supported"),
        (
            lambda m: ShardedTensor(torch.ones(2), "mesh", 0),
            TypeError,
            "ShardedTensor._mesh must be a torch.distributed.device_mesh.DeviceMesh (declared in opaque_attrs), got str",
        ),
        (
            lambda m: ShardedTensor(torch.ones(2, requires_grad=True), m, 0, requires_grad=True),
            ValueError,
            "requires_grad=True asks for a leaf, but the inner tensor '_local' requires grad",
        ),
    ],
)
def test_bad_construction(mesh, make, exc, message):
    with pytest.raises(exc) as info:
        make(mesh)
    assert message in str(info.value)


def test_construction_from_a_local_that_requires_grad_is_differentiable(mesh):
    local = torch.randn(2, 3, requires_grad=True)
    x = ShardedTensor(local, mesh, 0, outer_size=(4, 3))  # as rank 0 of 2 would see it
    assert x.requires_grad and x.grad_fn is not None and not x.local_tensor().requires_grad
    (x * 3).backward(ShardedTensor(torch.ones(2, 3), mesh, 0, outer_size=(4, 3)))
    torch.testing.assert_close(local.grad, torch.full((2, 3), 3.0))


def test_two_dimensional_mesh_is_refused(mesh):
    from torch.distributed.device_mesh import init_device_mesh

    mesh2d = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match=r"a 2-d DeviceMesh was given.*Fix: pass a 1-D submesh, e.g. mesh\['tp'\]"):
        ShardedTensor(torch.ones(2), mesh2d, 0)
    assert ShardedTensor(torch.ones(2), mesh2d["tp"], 0).shape == (2,)


# ---------------------------------------------------------------- errors from ops


def test_mesh_mismatch_is_an_error(mesh):
    a = ShardedTensor.from_full(torch.ones(2), mesh, 0)
    b = ShardedTensor.from_full(torch.ones(2), _other_mesh(), 0)
    with pytest.raises(OpaqueSubclassError, match="got arguments on different DeviceMesh objects.*Fix: re-shard"):
        a + b


def test_shard_dim_mismatch_is_an_error(mesh):
    a = ShardedTensor.from_full(torch.ones(2, 2), mesh, 0)
    b = ShardedTensor.from_full(torch.ones(2, 2), mesh, 1)
    with pytest.raises(
        OpaqueSubclassError, match=r"sharded along different dims \(0 and 1.*Fix: .*y.redistribute\(0\)"
    ):
        a + b
    torch.testing.assert_close((a + b.redistribute(0)).full_tensor(), torch.full((2, 2), 2.0))


def test_op_without_rule_is_an_error_that_names_the_fix(mesh):
    x = ShardedTensor.from_full(torch.arange(4.0), mesh, 0)
    with pytest.raises(OpaqueSubclassError) as info:
        x[1:]
    msg = str(info.value)
    assert "ShardedTensor has no rule for aten.slice.Tensor on a tensor sharded along dim 0" in msg
    assert "x.redistribute(None)" in msg and "@ShardedTensor.implements(torch.ops.aten.slice.Tensor)" in msg
    assert torch.equal(x.redistribute(None)[1:].full_tensor(), torch.arange(1.0, 4.0))  # the fix works


def test_in_place_into_plain_tensor_is_an_error(mesh):
    x = ShardedTensor.from_full(torch.ones(2), mesh, 0)
    with pytest.raises(
        OpaqueSubclassError,
        match="in-place aten.add_.Tensor would write a result sharded along dim 0 into 'self', a plain tensor",
    ):
        torch.zeros(2).add_(x)


def test_view_that_splits_the_shard_dim_is_an_error(mesh):
    x = ShardedTensor(torch.ones(2, 3), mesh, 0, outer_size=(4, 3))
    with pytest.raises(OpaqueSubclassError, match=r"splits or merges the shard dim 0\. Fix: keep dim 0 whole"):
        x.view(12)


def test_collective_checks_mesh_size_at_run_time(mesh):
    with pytest.raises(ValueError, match="split in 2 shards but its DeviceMesh has 1 ranks"):
        sharded.all_gather(torch.ones(2), mesh, 0, 2)


def test_local_chunk_refuses_uneven_shards_while_tracing(mesh):
    with FakeTensorMode() as mode:
        t = mode.from_tensor(torch.ones(3))
        with pytest.raises(ValueError, match="size 3 of dim 0 does not split into 2 equal shards. Fix: pad dim 0"):
            sharded.local_chunk(t, mesh, 0, 2)


def test_redistribute_of_a_plain_tensor_names_the_fix():
    with pytest.raises(TypeError, match=r"has no mesh. Fix: shard it with ShardedTensor.from_full"):
        torch.ops.opaque_subclass.redistribute(torch.ones(2), 0, 1)


# ---------------------------------------------------------------- collectives


def test_collectives_and_their_gradients(mesh):
    t = torch.arange(3.0, requires_grad=True)
    with sharded.record_collectives() as outer:
        with sharded.record_collectives() as inner:
            out = (
                sharded.all_reduce_sum(t, mesh) + sharded.all_gather(t, mesh, 0, 1) + sharded.local_chunk(t, mesh, 0, 1)
            )
        out.sum().backward()
    torch.testing.assert_close(out, 3 * t.detach())
    torch.testing.assert_close(t.grad, torch.full((3,), 3.0))
    assert [r.op for r in inner] == ["all_reduce_sum", "all_gather", "local_chunk"]
    assert len(outer) == 5 and {r.group_name for r in outer} == {mesh.get_group().group_name}
    assert not RECORDER.has_any("collectives")  # both blocks closed


# ---------------------------------------------------------------- compile


def _linear_net(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.linear(torch.relu(F.linear(x, w1, b1)), w2).pow(2).mean()


def _params(mesh: DeviceMesh, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(6, 4, generator=g), torch.randn(6, generator=g), torch.randn(3, 6, generator=g)]
    return [ShardedTensor.from_full(f, mesh, d, requires_grad=True) for f, d in zip(full, (0, 0, 1), strict=True)]


def test_compile_forward_backward_matches_eager(mesh):
    x = torch.randn(5, 4)
    ref = [p.full_tensor().requires_grad_(True) for p in _params(mesh)]
    want = _linear_net(x, *ref)
    want.backward()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    f = torch.compile(_linear_net, backend=counter, fullgraph=True)
    params = _params(mesh)
    loss = f(x, *params)
    loss.backward()
    assert type(loss) is ShardedTensor and loss.shard_dim is None and loss.mesh is mesh
    torch.testing.assert_close(loss.full_tensor(), want.detach())
    for p, r in zip(params, ref, strict=True):
        assert type(p.grad) is ShardedTensor and p.grad.mesh is mesh and p.grad.shard_dim == p.shard_dim
        torch.testing.assert_close(p.grad.full_tensor(), r.grad)
    assert counter.frame_count == 1


def test_compiled_graph_uses_the_runtime_mesh_group(mesh):
    """The property the mesh-as-opaque design exists for: no process group baked in."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    f = torch.compile(_linear_net, backend=counter, fullgraph=True)
    x = torch.randn(5, 4)
    seen = {}
    for name, m in (("A", mesh), ("B", _other_mesh()), ("C", _other_mesh())):
        params = _params(m)
        with sharded.record_collectives() as records:
            f(x, *params).backward()
        assert records and {r.mesh_id for r in records} == {id(m)}
        assert {r.group_id for r in records} == {id(m.get_group())}
        seen[name] = {r.group_name for r in records}
        assert all(p.grad.mesh is m for p in params)
    assert seen["A"] != seen["B"] != seen["C"] != seen["A"]
    assert counter.frame_count == 1


def test_compile_passes_find_no_baked_group_or_value_in_the_sharded_step(mesh):
    """#26: the lints report nothing that needs fixing on the library's own
    ShardedTensor step (its collectives are custom ops taking the mesh)."""
    import compile_passes as cp

    report = cp.explain(_linear_net, torch.randn(5, 4), *_params(mesh))
    assert report.graphs, "nothing was compiled"
    assert [f for f in report.findings if f.severity != "info"] == []
    assert [f for f in report.findings if f.code == "OSC005"] == []


def test_compile_redistribute_and_full_reduction(mesh):
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda x: (x.redistribute(None) * x).sum(1).mean(), backend=counter, fullgraph=True)
    full = torch.randn(4, 6)
    x = ShardedTensor.from_full(full, mesh, 1, requires_grad=True)
    out = f(x)
    out.backward()
    torch.testing.assert_close(out.full_tensor(), (full * full).sum(1).mean())
    torch.testing.assert_close(x.grad.full_tensor(), 2 * full / 4)
    assert counter.frame_count == 1


def test_compiled_redistribute_is_a_method_call_aotautograd_can_cache(mesh):
    """torch 2.11's Dynamo took any tensor method named ``redistribute`` for
    DTensor's and put it in the graph as a call of a closure, which AOTAutograd's
    cache refuses ("Unsupported call_function target ...
    redistribute_fn_with_prim_types"): every process of a job compiled again.
    On every leg the call is a ``call_method`` node and the graph passes the
    cache's check."""
    from torch._functorch._aot_autograd.autograd_cache import check_cacheable

    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        graphs.append(gm)
        return gm

    f = torch.compile(lambda x: (x.redistribute(None) * x).sum(1).mean(), backend=capture, fullgraph=True)
    full = torch.randn(4, 6)
    out = f(ShardedTensor.from_full(full, _State.mesh, 1))
    torch.testing.assert_close(out.full_tensor(), (full * full).sum(1).mean())
    (gm,) = graphs
    calls = [(n.op, str(n.target)) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert ("call_method", "redistribute") in calls and not [c for c in calls if "<locals>" in c[1]], calls
    check_cacheable(gm)  # raises BypassAOTAutogradCache for a graph the cache cannot key


# ---------------------------------------------------------------- two ranks


def two_ranks(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Run by each of 2 local ranks: every rule against plain tensors on full values."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import opaque_subclass.sharded as sh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world_size,))
    g = torch.Generator().manual_seed(1)
    errors: dict[str, float] = {}

    def check(name: str, fn: Any, *specs: tuple[tuple[int, ...], Any]) -> None:
        fulls = [torch.randn(shape, generator=g) for shape, _ in specs]
        ref_in = [f.clone().requires_grad_(True) for f in fulls]
        ref_out = fn(*ref_in)
        weight = torch.randn(ref_out.shape, generator=g)
        (ref_out * weight).sum().backward()
        ins = [
            f.clone().requires_grad_(True)
            if p == "plain"
            else sh.ShardedTensor.from_full(f, mesh, p, requires_grad=True)
            for f, (_, p) in zip(fulls, specs, strict=True)
        ]
        out = fn(*ins)
        (out * weight).sum().backward()
        full_out = out.full_tensor() if isinstance(out, sh.ShardedTensor) else out.detach()
        err = float((full_out - ref_out.detach()).abs().max())
        for i, r in zip(ins, ref_in, strict=True):
            grad = i.grad.full_tensor() if isinstance(i.grad, sh.ShardedTensor) else i.grad
            err = max(err, float((grad - r.grad).abs().max()))
        errors[name] = err

    check("add broadcast plain", torch.add, ((4, 6), 1), ((6,), "plain"))
    check("add aligned 1-d shard", torch.add, ((4, 6), 1), ((6,), 0))
    check("mul replicated", torch.mul, ((4, 6), 0), ((4, 6), None))
    check("relu / div", lambda a: torch.relu(a) / 3, ((4, 6), 0))
    check("t", lambda a: a.t() * 1, ((4, 6), 0))
    check("transpose", lambda a: a.transpose(0, -1) * 1, ((4, 6), 1))
    check("permute", lambda a: a.permute(2, 0, 1) * 1, ((2, 4, 6), 2))
    check("view", lambda a: a.view(2, 2, 6) * 1, ((4, 6), 1))
    check("unsqueeze/expand/squeeze", lambda a: a.unsqueeze(0).expand(3, 4, 6).squeeze(0) * 1, ((4, 6), 1))
    for pa in ("plain", None, 0, 1):
        for pb in ("plain", None, 0, 1):
            if (pa, pb) != ("plain", "plain"):
                check(f"mm {pa} x {pb}", torch.mm, ((4, 6), pa), ((6, 8), pb))
    check("linear column-parallel", F.linear, ((3, 4), "plain"), ((6, 4), 0), ((6,), 0))
    check("linear row-parallel", F.linear, ((3, 4), 1), ((6, 4), 1), ((6,), None))
    check(
        "addmm alpha beta",
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0),
        ((6,), 0),
        ((3, 4), "plain"),
        ((4, 6), 1),
    )
    check("matmul 3-d", lambda x, w: x @ w.t(), ((2, 3, 4), "plain"), ((6, 4), 0))
    check("sum", torch.sum, ((4, 6), 0))
    check("sum over shard dim", lambda a: a.sum(0), ((4, 6), 0))
    check("sum over other dim", lambda a: a.sum(0, keepdim=True), ((4, 6), 1))
    check("mean", torch.mean, ((4, 6), 1))
    check("mean dims", lambda a: a.mean((0, 2)), ((2, 4, 6), 2))
    check("mean other dim", lambda a: a.mean(1), ((4, 6), 0))

    def to_dim1(a: torch.Tensor) -> torch.Tensor:
        return (a.redistribute(1) if isinstance(a, sh.ShardedTensor) else a) * 1

    check("redistribute 0 -> 1", to_dim1, ((4, 6), 0))
    check("redistribute None -> 1", to_dim1, ((4, 6), None))

    leaf = torch.randn(2, 6, generator=g, requires_grad=True)  # this rank's shard of a (4, 6) tensor
    (sh.ShardedTensor(leaf, mesh, 0).sum() * 2).backward()  # a replicated gradient reaches the construction
    errors["construct from local"] = float((leaf.grad - 2).abs().max())

    local = sh.ShardedTensor.from_full(torch.arange(4.0), mesh, 0).local_tensor()
    uneven = ""
    try:
        sh.ShardedTensor.from_full(torch.ones(3), mesh, 0)
    except ValueError as e:
        uneven = str(e)

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    f = torch.compile(_linear_net, backend=counter, fullgraph=True)
    x = torch.randn(5, 4, generator=g)
    ref = [p.full_tensor().requires_grad_(True) for p in _params(mesh)]
    want = _linear_net(x, *ref)
    want.backward()
    groups = []
    for m in (mesh, DeviceMesh.from_group(dist.new_group([0, 1]), "cpu")):
        params = _params(m)
        with sh.record_collectives() as records:
            loss = f(x, *params)
            loss.backward()
        err = float((loss.full_tensor() - want.detach()).abs().max())
        for p, r in zip(params, ref, strict=True):
            err = max(err, float((p.grad.full_tensor() - r.grad).abs().max()))
        errors[f"compiled on mesh {len(groups)}"] = err
        groups.append(sorted({r.group_name for r in records}))
    return {
        "errors": errors,
        "local": local.tolist(),
        "uneven": uneven,
        "groups": groups,
        "frames": counter.frame_count,
    }


def test_two_ranks():
    t0 = time.monotonic()
    results = run_local_workers(f"{__file__}:two_ranks", 2, timeout=110)
    assert time.monotonic() - t0 < 110
    for rank, r in enumerate(results):
        bad = {k: v for k, v in r["errors"].items() if not v <= 1e-5}
        assert not bad, f"rank {rank}: {bad}"
        assert r["local"] == [2.0 * rank, 2.0 * rank + 1]
        assert "size 3 of dim 0 does not split into 2 equal shards" in r["uneven"] and "Fix: pad dim 0" in r["uneven"]
        assert r["frames"] == 1
        assert r["groups"][0] != r["groups"][1] and all(r["groups"])
    assert len(results[0]["errors"]) == 39
