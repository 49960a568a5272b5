"""Programs on NVIDIA PhysicsNeMo's ``ShardTensor`` run by tests/test_adopt_physicsnemo.py
in processes of their own: a step of :func:`opaque_subclass.testing.simulate_job`
(``job_step``) and a target of :func:`opaque_subclass.testing.run_local_workers`
(``gloo_train``, on real gloo ranks). Both import PhysicsNeMo after the library
(each entry point imports ``opaque_subclass`` first) and adopt the class with
:func:`opaque_subclass.adoption.physicsnemo_shard_tensor`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo.testing
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard

import opaque_subclass
from opaque_subclass.dtensor import share_compiles
from opaque_subclass.sharded import record_collectives


def gathered_loss(t: Any) -> torch.Tensor:
    """Gather ``t`` on its own mesh (``ShardTensor.redistribute`` to ``Replicate`` on
    every mesh dimension: an all-gather per sharded dimension) and reduce it to a loss."""
    full = t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim).to_local()
    return (full * full).sum() + full.sum()


def two_gathers(a: Any, b: Any) -> torch.Tensor:
    return gathered_loss(a) + gathered_loss(b)


def job_step(mesh: DeviceMesh, payload: dict[str, Any]) -> dict[str, Any]:
    """One rank of the simulated job on its 2-D ``(dp, tp)`` mesh: a ``ShardTensor``
    sharded over each 1-D sub-mesh (``mesh["dp"]``, ``mesh["tp"]``), both gathered in
    one function compiled with inductor under ``share_compiles``; the groups its
    collectives ran on. Forward only: the backward of a gather takes this rank's chunk
    of the gradient, a rank-dependent graph that ``share_compiles`` refuses."""
    from physicsnemo.domain_parallel import ShardTensor

    opaque_subclass.adoption.physicsnemo_shard_tensor()
    size = payload["global_size"]
    shards = []
    for name in ("dp", "tp"):
        sub = mesh[name]
        local = torch.ones(size // sub.size(), 3)
        shards.append(ShardTensor.from_local(local, sub, [Shard(0)], sharding_shapes="chunk", global_shape=(size, 3)))
    compiled = torch.compile(two_gathers, backend="inductor")
    with share_compiles(), record_collectives() as seen:
        loss = compiled(*shards)
    return {
        "own_groups": sorted(str(mesh.get_group(d).group_name) for d in range(mesh.ndim)),
        "collective_groups": sorted({r.group_name for r in seen}),
        "collectives": len(seen),
        "loss": loss.item(),
    }


def gloo_train(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Two meshes of one shape over the same ranks, each with a process group of its own;
    on each, a shard of rank-dependent data: the loss above compiled (inductor) and
    eagerly, forward and backward. Returns both losses and local gradients per mesh,
    whether each gradient is a ``ShardTensor`` on the call's mesh, and the compilations."""
    from physicsnemo.domain_parallel import ShardTensor

    ranks = list(range(world_size))
    meshes = [DeviceMesh.from_group(dist.new_group(ranks), "cpu") for _ in range(2)]
    adoption = opaque_subclass.adoption.physicsnemo_shard_tensor()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(gathered_loss, backend=counter)
    global_shape = (4 * world_size, 3)

    def shard(mesh: DeviceMesh, offset: float) -> Any:
        local = torch.arange(12.0).reshape(4, 3) / 7 + rank + offset
        x = ShardTensor.from_local(local, mesh, [Shard(0)], sharding_shapes="chunk", global_shape=global_shape)
        return x.detach().requires_grad_(True)

    calls = []
    for i, mesh in enumerate(meshes):
        x, y = shard(mesh, float(i)), shard(mesh, float(i))
        loss = compiled(x)
        loss.backward()
        eager_loss = gathered_loss(y)
        eager_loss.backward()
        calls.append(
            {
                "compiled": [loss.item(), x.grad._local_tensor.tolist()],
                "eager": [eager_loss.item(), y.grad._local_tensor.tolist()],
                "grad_on_call_mesh": type(x.grad) is ShardTensor and x.grad._spec.mesh is mesh,
                "eager_grad_on_call_mesh": type(y.grad) is ShardTensor and y.grad._spec.mesh is mesh,
            }
        )
    adoption.undo()
    return {"calls": calls, "compilations": counter.frame_count}
