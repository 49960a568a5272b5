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
