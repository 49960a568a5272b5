"""Tensor-parallel MLP training with ShardedTensor under torch.compile.

Two local processes (gloo on 127.0.0.1) each hold half of every weight. The
first layer is column-parallel (weight sharded on dim 0), the second row-parallel
(weight sharded on dim 1; its output is all-reduced inside the compiled graph).
Run::

    python examples/sharded_mlp.py

Then the trained weights move to a mesh on a new process group, and the same
compiled function trains on, without recompiling; the collectives report the
group they ran on.
"""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo.testing
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from opaque_subclass.sharded import record_collectives, shard_module
from opaque_subclass.testing import run_local_workers

PLAN = {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None}


def train(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)  # the same weights and data on every rank
    model = shard_module(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), init_device_mesh("cpu", (world_size,)), PLAN
    )
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")  # or "inductor"
    loss_fn = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend=counter, fullgraph=True)
    losses, groups = [], []
    for mesh_step in range(2):
        if mesh_step == 1:  # a second mesh on a new process group: same compiled function
            model = shard_module(model, DeviceMesh.from_group(dist.new_group(list(range(world_size))), "cpu"), PLAN)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with record_collectives() as seen:
            for _ in range(3):
                x, y = torch.randn(8, 16), torch.randn(8, 8)
                loss = loss_fn(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(round(loss.item(), 5))
        groups.append(sorted({r.group_name for r in seen}))
    return {"losses": losses, "groups": groups, "compilations": counter.frame_count}


if __name__ == "__main__":
    rank0, rank1 = run_local_workers(f"{__file__}:train", world_size=2, timeout=100)
    assert rank0 == rank1, "the ranks disagree"
    print(f"losses         {rank0['losses']}")
    print(f"process groups {rank0['groups'][0]} (mesh A), then {rank0['groups'][1]} (mesh B)")
    print(f"compilations   {rank0['compilations']}")
