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
