"""Save a sharded model in one distributed job, run it in another.

Job 1 (:func:`export_and_save`, 2 gloo processes) shards an MLP with
:class:`~opaque_subclass.sharded.ShardedTensor` weights, exports it and saves
each rank's program (its shards) with ``opaque_subclass.export.save`` (with
``payload["unwrap"]``, after ``unwrap_subclass_parameters``); the
``DeviceMesh`` is stored by name only. Job 2 (:func:`load_and_run`, 2 new
processes on another port) builds its mesh on a process group of its own
(``dist.new_group``), loads the program with that mesh and runs a forward; the
collectives are recorded as they run, so one that ran on any other group
would show. Used by tests/test_export_archive.py and docs/export.md.

Run both jobs::

    python examples/sharded_export.py
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import opaque_subclass.export as oexport
from opaque_subclass import unwrap_subclass_parameters
from opaque_subclass.cli.demo import MLP_PLAN
from opaque_subclass.sharded import ShardedTensor, shard_module
from opaque_subclass.sharded.collectives import record_collectives


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))


def _input() -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


def _path(payload: dict[str, Any], rank: int) -> str:
    return os.path.join(payload["dir"], f"sharded_rank{rank}.pt2")


def export_and_save(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    model = shard_module(_model(), mesh, MLP_PLAN)
    if payload.get("unwrap"):  # the weights as plain tensors, rebuilt inside the graph
        unwrap_subclass_parameters(model)
    ep = torch.export.export(model, (_input(),), strict=payload["strict"])
    manifest = oexport.save(ep, _path(payload, rank), opaques={"mesh": mesh})
    return {"names": list(manifest.names), "types": [r.type_name for r in manifest.opaques]}


def load_and_run(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.device_mesh import DeviceMesh

    group = dist.new_group(list(range(world_size)))
    mesh = DeviceMesh.from_group(group, "cpu")
    ep = oexport.load(_path(payload, rank), opaques={"mesh": mesh})
    # the program's meshes: inside its ShardedTensor weights, or, after
    # unwrap_subclass_parameters, lifted constants that rebuild them
    meshes = {id(p.mesh) for p in ep.state_dict.values() if isinstance(p, ShardedTensor)}
    meshes |= {id(c) for c in ep.constants.values() if isinstance(c, DeviceMesh)}
    with record_collectives() as records:
        out = ep.module()(_input())
    full = out.full_tensor()
    reference = _model()(_input())
    return {
        "params_hold_loader_mesh": meshes == {id(mesh)},
        "output_mesh_is_loader_mesh": out.mesh is mesh,
        "max_abs_error": float((full - reference).abs().max()),
        "collectives": [r.op for r in records],
        "on_new_group": [r.group_name == group.group_name and r.mesh_id == id(mesh) for r in records],
        "new_group_is_not_world": group.group_name != dist.group.WORLD.group_name,
    }


def main() -> None:
    import json
    import tempfile

    from opaque_subclass.testing import run_local_workers

    with tempfile.TemporaryDirectory() as folder:
        payload = {"dir": folder, "strict": False}
        print(run_local_workers(f"{__file__}:export_and_save", 2, payload=payload, timeout=240)[0])
        print(json.dumps(run_local_workers(f"{__file__}:load_and_run", 2, payload=payload, timeout=240)[0], indent=1))


if __name__ == "__main__":
    main()
