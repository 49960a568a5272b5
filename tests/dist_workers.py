"""Worker bodies for the multi-process tests (tests/test_distributed.py).

Each is a target of :func:`opaque_subclass.testing.run_local_workers`
(``"/path/to/dist_workers.py:sync_states"``): it runs in every rank after the
launcher joined a gloo group on 127.0.0.1 (bounded timeouts), and returns a
JSON-able result; the launcher destroys the group.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# The launcher puts the checkout on the workers' path; the fixtures module is
# beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from subclasses import Mesh, MeshTensor
from torch.distributed.tensor import Replicate

import opaque_subclass


class Weight(opaque_subclass.OpaqueSubclass):
    """A weight carrying its mesh; the declarative base's dispatch handles FSDP2's ops."""

    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


def sync_states(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """FSDP1's module-state sync on subclass parameters/buffers (device check bypassed)."""
    from torch.distributed.fsdp import _init_utils

    mesh, inner_mesh = Mesh(f"rank{rank}"), Mesh(f"inner{rank}")
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(MeshTensor(torch.full((3,), float(rank + 1)), mesh))
    module.register_buffer("b", MeshTensor(torch.full((2,), float(10 * (rank + 1))), inner_mesh))
    # torch allows sync_module_states only for GPU tensors; the walk under test is device-independent.
    _init_utils._check_module_states_for_sync_module_states = lambda states: None
    _init_utils._sync_module_params_and_buffers(module, list(module.parameters()), dist.group.WORLD)
    return {
        "w": module.w._data.tolist(),
        "b": module.b._data.tolist(),
        "mesh_kept": module.w._mesh is mesh and module.b._mesh is inner_mesh,
    }


def _model(mesh: Mesh) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    for lin in model:
        lin.weight = torch.nn.Parameter(Weight(lin.weight.detach().clone(), mesh))
    return model


def fsdp2_train(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 fully_shard of a model with subclass weights: compiled training equals eager."""
    from torch.distributed.fsdp import fully_shard

    losses: dict[str, list[float]] = {}
    for label in ("eager", "compiled"):
        mesh = Mesh(f"m{rank}")
        model = _model(mesh)
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1 + rank)
        data = [torch.randn(5, 4) for _ in range(3)]

        def step(x: torch.Tensor) -> torch.Tensor:
            out = model(x)  # noqa: B023 - step is called only within this iteration
            return (out * out).sum()

        run = torch.compile(step, backend="aot_eager") if label == "compiled" else step
        losses[label] = []
        for x in data:
            loss = run(x)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[label].append(float(loss.detach()))
        local = model[0].weight.to_local()
        kept = type(local) is Weight and local._mesh is mesh
        losses[label + "_mesh_kept"] = [float(kept)]
    return {"losses": losses}


def _tp_fsdp_model(mesh: Any) -> torch.nn.Module:
    """A two-layer MLP, tensor parallel over ``mesh["tp"]`` (column- then
    row-wise) and FSDP2-sharded over ``mesh["dp"]``: 2-D DTensor parameters."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model


def fsdp2_tp_train(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 + tensor parallel on a 2x2 (dp, tp) mesh, 3 SGD steps: losses in
    eager, compiled with torch stock (the library disabled) and compiled with
    the library, with ``DeviceMesh`` registered as a reference opaque (torch
    2.12+ registers it itself; on torch 2.11 this turns on DTensor's mesh as an
    opaque attribute). Also whether DTensor lists its mesh among its flatten
    attributes."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    opaque_subclass.register_opaque(DeviceMesh)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(1 + mesh["dp"].get_local_rank())  # one batch per dp rank, the same on its tp ranks
    data = [torch.randn(3, 8) for _ in range(3)]
    result: dict[str, Any] = {}
    for label in ("eager", "compiled_stock", "compiled"):
        if label == "compiled_stock":
            opaque_subclass.disable()
        torch._dynamo.reset()
        model = _tp_fsdp_model(mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            return model(x).pow(2).sum()  # noqa: B023 - step is called only within this iteration

        run = step if label == "eager" else torch.compile(step, backend=payload.get("backend", "aot_eager"))
        losses = []
        for x in data:
            loss = run(x)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        result[label] = losses
        result[label + "_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        torch._dynamo.utils.counters.clear()
        if label == "compiled_stock":
            opaque_subclass.enable()
    weight = model[0].weight
    result["mesh_listed"] = "device_mesh" in weight.__tensor_flatten__()[0]
    result["weight_mesh_ndim"] = weight.device_mesh.ndim
    return result


def job_cache_numerics(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's tensor-parallel step (benchmarks/bench_job_compile.py) on
    a real (dp=2, tp=2) gloo mesh, compiled with the artifacts another process
    left in ``TORCHINDUCTOR_CACHE_DIR``, then eagerly from the same weights:
    the losses, the largest difference of the trained weights, the AOTAutograd
    cache counters and the groups the compiled collectives used."""
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh

    from opaque_subclass.sharded import record_collectives

    sys.path.insert(0, payload["benchmarks"])
    import bench_job_compile as job

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    compiled_model, eager_model = job.sharded_model(mesh), job.sharded_model(mesh)
    with record_collectives() as seen:
        compiled = job.train(compiled_model, mesh, 3, lambda g: g.local_tensor(), compiled=True)
    eager = job.train(eager_model, mesh, 3, lambda g: g.local_tensor(), compiled=False)
    diff = max(
        float((a.full_tensor() - b.full_tensor()).abs().max())
        for a, b in zip(compiled_model.parameters(), eager_model.parameters(), strict=True)
    )
    return {
        "compiled": compiled,
        "eager": eager,
        "weight_diff": diff,
        "aot": [counters["aot_autograd"]["autograd_cache_hit"], counters["aot_autograd"]["autograd_cache_miss"]],
        "groups": sorted({r.group_name for r in seen}),
        "own_group": str(mesh["tp"].get_group().group_name),
    }


def dtensor_job_numerics(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's DTensor tensor-parallel step under ``share_compiles`` on a
    real (dp=2, tp=2) gloo mesh, compiled with the artifacts another process
    left in ``TORCHINDUCTOR_CACHE_DIR``, then the same model eagerly: the
    losses, the largest difference of the trained weights, the AOTAutograd
    cache counters and the groups the compiled collectives used."""
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from opaque_subclass.dtensor import share_compiles
    from opaque_subclass.sharded import record_collectives

    sys.path.insert(0, payload["benchmarks"])
    import bench_job_compile as job

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    torch.manual_seed(0)
    compiled_model = parallelize_module(job._model(2), mesh["tp"], plan)
    torch.manual_seed(0)
    eager_model = parallelize_module(job._model(2), mesh["tp"], plan)
    with share_compiles(), record_collectives() as seen:
        compiled = job.train(compiled_model, mesh, 3, lambda g: g.to_local(), compiled=True)
    eager = job.train(eager_model, mesh, 3, lambda g: g.to_local(), compiled=False)
    diff = max(
        float((a.full_tensor() - b.full_tensor()).abs().max())
        for a, b in zip(compiled_model.parameters(), eager_model.parameters(), strict=True)
    )
    aot = counters["aot_autograd"]
    return {
        "compiled": compiled,
        "eager": eager,
        "weight_diff": diff,
        "aot": [aot["autograd_cache_hit"], aot["autograd_cache_miss"], aot["autograd_cache_bypass"]],
        "groups": sorted({r.group_name for r in seen}),
        "own_group": str(mesh["tp"].get_group().group_name),
    }


# ---------------------------------------------------------------- compile_passes on real programs (#26 item 7)


def float8_amax_step(x8: Any) -> Any:
    """The Float8-like program: the amax of the tensor, reduced over its amax
    group by a functional collective (OSC005), and an op on the tensor, whose
    rule divides by the group's size read below Dynamo (OSC004)."""
    import torch.distributed._functional_collectives as funcol

    amax = funcol.all_reduce(x8._data.abs().amax() * x8._scale, "max", x8._group)
    y = x8 * 2
    return y._data * y._scale / amax


def dtensor_step(x: Any) -> Any:
    """A DTensor program with two collectives, both issued below Dynamo: an
    all-gather (Shard -> Replicate) and the all-reduce of a partial sum."""
    gathered = x.redistribute(x.device_mesh, [Replicate()]).to_local()
    return gathered * 2 + (x * x).sum().full_tensor()


def _rows(findings: Any) -> list[list[str]]:
    return [[f.code, f.severity, f.path, f.message] for f in findings]


def _checked(fn: Any, inner: str) -> tuple[Any, list[Any]]:
    """``fn`` compiled with the checking backend (``inner`` compiles; below-Dynamo watching on)."""
    import compile_passes

    checks: list[Any] = []
    backend = compile_passes.checking_backend(inner, "record", on_check=checks.append, watch_reads=True)
    return torch.compile(fn, backend=backend), checks


def _outcome(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` as a list, or the first line of the error it raised."""
    try:
        return fn(*args).tolist()
    except Exception as error:
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


def _fixed(obj: Any, fixes: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Each fix applied as written: its code block executed, its ``replace `a`
    with `b``` applied to the source of ``obj`` (once each), the source
    executed in ``namespace``."""
    import inspect
    import re

    for fix in fixes:
        for code in re.findall(r"```\n(.*?)\n```", fix, re.S):
            if code not in _FIX_CODE:
                _FIX_CODE[code] = {}
                exec(code, _FIX_CODE[code])  # defines the fix's custom op, once per process
            namespace.update(_FIX_CODE[code])
    source = inspect.getsource(obj)
    for fix in fixes:
        for old, new in re.findall(r"replace `([^`]+)` with `([^`]+)`", fix):
            if old in source:
                if source.count(old) != 1:
                    raise AssertionError(f"the fix's {old!r} occurs {source.count(old)} times in {obj.__qualname__}")
                source = source.replace(old, new)
    exec(source, namespace)
    return namespace


_FIX_CODE: dict[str, dict[str, Any]] = {}


def lint_real_programs(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """compile_passes on real programs, on this gloo group (#26 item 7): the
    checking backend's findings (below-Dynamo watching on) and what the
    compiled programs compute.

    * ``float8``: :func:`float8_amax_step` on a ``subclasses.Float8Like`` over
      the world group, compiled with ``payload["float8_backend"]``; then its
      two fixes applied as written (the class's and the function's source) and
      the fixed program compiled once and called with the world group and with
      this rank's group of one.
    * ``sharded``: the demo's training step (``opaque_subclass.cli.demo``)
      on ``ShardedTensor`` weights, 2 steps on one mesh and 1 on a mesh of a
      new group, compiled with ``payload["backend"]``.
    * ``dtensor``: :func:`dtensor_step` on a row-sharded DTensor.
    * ``physicsnemo``: ``compile_passes.explain`` of a PhysicsNeMo-like
      ShardTensor (a ``DeviceMesh`` in its spec, in the flatten context), and
      the mesh a second call's output carries, given an equal mesh of another group.
    """
    import time

    import subclasses
    from subclasses import Float8Like, PhysicsNeMoLikeShardTensor, ShardTensorSpec
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.distributed_c10d import ProcessGroup
    from torch.distributed.tensor import Shard, distribute_tensor

    import compile_passes
    from opaque_subclass.cli.demo import MLP_PLAN, _loss, _mlp
    from opaque_subclass.sharded import shard_module

    opaque_subclass.register_opaque(ProcessGroup)
    torch._inductor.config.compile_threads = 1  # no pool of compile workers per rank: 2 ranks share the CPUs
    backend, seconds, out = str(payload["backend"]), {}, {}

    started = time.perf_counter()
    world = dist.group.WORLD
    _, singles = dist.new_subgroups(1)  # every rank's group of one
    data, scale = torch.tensor([1.0, -3.0]) * (rank + 1), torch.tensor(0.5)
    torch._dynamo.reset()
    compiled, checks = _checked(float8_amax_step, str(payload["float8_backend"]))
    result = _outcome(compiled, Float8Like(data, scale, world))
    findings = [f for c in checks for f in c.findings]
    namespace = _fixed(Float8Like, [f.fix for f in findings], dict(vars(subclasses)))
    fixed_cls = namespace["Float8Like"]
    fixed_step = _fixed(float8_amax_step, [f.fix for f in findings], {**globals(), **namespace})["float8_amax_step"]
    torch._dynamo.reset()
    compiled, fixed_checks = _checked(fixed_step, str(payload["float8_backend"]))
    groups = (world, singles[rank])
    fixed_results = [_outcome(compiled, fixed_cls(data, scale, g)) for g in groups]  # compiles, then runs
    out["float8"] = {
        "findings": _rows(findings),
        "fixes": [f.fix for f in findings],
        "result": result,
        "eager": float8_amax_step(Float8Like(data, scale, world)).tolist(),
        "fixed_findings": _rows(f for c in fixed_checks for f in c.findings),
        "fixed_results": fixed_results,
        "fixed_graphs": len(fixed_checks),
        "fixed_eager": [fixed_step(fixed_cls(data, scale, g)).tolist() for g in groups],
        "group_sizes": [g.size() for g in groups],
    }
    seconds["float8"] = time.perf_counter() - started

    started = time.perf_counter()
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = shard_module(_mlp(), mesh, MLP_PLAN)
    batches = [(torch.randn(8, 16), torch.randn(8, 8)) for _ in range(3)]
    torch._dynamo.reset()
    compiled, checks = _checked(_loss, backend)
    losses = []
    for step, (x, target) in enumerate(batches):
        if step == 2:  # the trained weights, on a mesh of a new group
            mesh_b = DeviceMesh.from_group(dist.new_group(list(range(world_size))), "cpu")
            model = shard_module(model, mesh_b, MLP_PLAN)
        loss = compiled(model, x, target)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad, alpha=0.1)
                p.grad = None
        losses.append(float(loss.detach()))
    out["sharded"] = {
        "findings": _rows(f for c in checks for f in c.findings),
        "graphs": len(checks),
        "losses": losses,
        "parameters": len(list(model.parameters())),
    }
    seconds["sharded"] = time.perf_counter() - started

    started = time.perf_counter()
    torch._dynamo.reset()
    x = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    compiled, checks = _checked(dtensor_step, backend)
    result = _outcome(compiled, x)  # compiles, then runs
    out["dtensor"] = {
        "findings": _rows(f for c in checks for f in c.findings),
        "result": result,
        "graphs": len(checks),
        "eager": dtensor_step(x).tolist(),
        "group_name": str(mesh.get_group().group_name),
    }
    seconds["dtensor"] = time.perf_counter() - started

    started = time.perf_counter()
    torch._dynamo.reset()
    other = DeviceMesh.from_group(dist.new_group(list(range(world_size))), "cpu")
    shapes = ((2,),) * world_size
    spec, other_spec = ShardTensorSpec(mesh, (0,), shapes), ShardTensorSpec(other, (0,), shapes)

    def double(t: Any) -> Any:
        return t * 2

    report = compile_passes.explain(double, PhysicsNeMoLikeShardTensor(torch.ones(2), spec))
    compiled = torch.compile(double, backend=backend)
    first = compiled(PhysicsNeMoLikeShardTensor(torch.ones(2), spec)).spec.mesh
    second = compiled(PhysicsNeMoLikeShardTensor(torch.ones(2), other_spec)).spec.mesh
    out["physicsnemo"] = {
        "findings": _rows(report.findings),
        "errors": report.errors,
        "specs_equal": spec == other_spec,
        "first_is_mesh": first is mesh,
        "second_is_first_mesh": second is mesh,
        "second_is_its_own_mesh": second is other,
    }
    seconds["physicsnemo"] = time.perf_counter() - started
    out["seconds"] = seconds
    return out


def shared_chunk_step(mesh: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A step of ``opaque_subclass.testing.simulate_job`` (tests/test_dtensor_share.py),
    not a worker: two programs on a Replicate / Shard(0) DTensor compiled with
    inductor under ``share_compiles``, each compiled output beside its eager
    one, and each program's AOTAutograd cache hits. ``chunk`` picks this rank's
    chunk (``(t * 2).redistribute(t.device_mesh, [Shard(0)])``): the library's
    refusal (its message) where it refuses; ``free`` (``(t * 2 + 1).to_local()``)
    is the same program on every rank."""
    from torch._dynamo.utils import counters
    from torch.distributed.tensor import DTensor, Shard

    from opaque_subclass.dtensor import ShareCompilesError, share_compiles

    programs = {
        "chunk": (lambda t: (t * 2).redistribute(t.device_mesh, [Shard(0)]).to_local(), [Replicate()]),
        "free": (lambda t: (t * 2 + 1).to_local(), [Shard(0)]),
    }
    out: dict[str, Any] = {}
    for name, (fn, placements) in programs.items():
        x = DTensor.from_local(torch.arange(8.0), mesh, placements, run_check=False)
        seen: dict[str, Any] = {"eager": fn(x).tolist()}
        hits = counters["aot_autograd"]["autograd_cache_hit"]
        try:
            with share_compiles():
                seen["compiled"] = torch.compile(fn, fullgraph=True)(x).tolist()
        except ShareCompilesError as e:
            seen["refused"] = str(e)
        seen["aot_hits"] = counters["aot_autograd"]["autograd_cache_hit"] - hits
        out[name] = seen
    return out


def _sharded_export_example() -> Any:
    """examples/sharded_export.py, loaded by path (examples/ is not a package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "sharded_export.py")
    spec = importlib.util.spec_from_file_location("sharded_export_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export_every_mode(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """The example's job 1 once per mode of ``payload["modes"]`` (a name to the
    example's payload keys), each archive in its own folder: one launch of the
    ranks for every mode."""
    example = _sharded_export_example()
    saved = {}
    for name, keys in payload["modes"].items():
        folder = os.path.join(payload["dir"], name)
        os.makedirs(folder, exist_ok=True)
        saved[name] = example.export_and_save(rank, world_size, {"dir": folder, **keys})
    return saved


def load_every_mode(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """The example's job 2 once per mode, each on a process group made for it."""
    example = _sharded_export_example()
    return {
        name: example.load_and_run(rank, world_size, {"dir": os.path.join(payload["dir"], name), **keys})
        for name, keys in payload["modes"].items()
    }
