"""Storage accounting, torch's memory tools, FSDP1 module-state sync and FSDP2
training with opaque-attribute subclasses (2 gloo processes on 127.0.0.1,
started by the library's launcher, ``run_local_workers``)."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
from subclasses import Mesh, MeshTensor, nested

import opaque_subclass as osc
from opaque_subclass.testing import run_local_workers

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_workers.py")


def _run(name: str, world_size: int = 2, timeout: float = 180.0) -> list[Any]:
    """Each rank's result of ``dist_workers.<name>``; every wait bounded by ``timeout``."""
    results = run_local_workers(f"{WORKERS}:{name}", world_size, timeout=timeout)
    assert len(results) == world_size, results
    return results


def test_untyped_storages_walks_nested_and_skips_opaques():
    x = nested(3)
    storages = osc.untyped_storages(x)
    assert storages == {x._data._data._data.untyped_storage()}
    plain = torch.ones(2)
    assert osc.untyped_storages(plain) == {plain.untyped_storage()}
    with pytest.raises(TypeError, match="untyped_storages expects a tensor, got subclasses.Mesh. Fix: "):
        osc.untyped_storages(Mesh())


def test_torch_get_untyped_storages_skips_opaques():
    from torch.distributed._tools.common_utils import get_untyped_storages

    x = MeshTensor(MeshTensor(torch.ones(4), Mesh()), Mesh())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_untyped_storages(x) == {x._data._data.untyped_storage()}


def test_mem_tracker_with_subclass_parameters():
    from torch.distributed._tools.mem_tracker import MemTracker

    model = torch.nn.Linear(4, 4)
    model.weight = torch.nn.Parameter(MeshTensor(torch.randn(4, 4), Mesh()))
    tracker = MemTracker()
    tracker.track_external(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tracker:
            model(torch.randn(2, 4)).sum().backward()
    snapshot = tracker.get_tracker_snapshot()
    assert snapshot, "MemTracker recorded nothing"


def test_fsdp1_sync_module_states_broadcasts_tensors_and_keeps_opaques():
    results = _run("sync_states")
    for r in results:
        assert r["w"] == [1.0, 1.0, 1.0], r  # rank 0's values everywhere
        assert r["b"] == [10.0, 10.0], r
        assert r["mesh_kept"] is True


def test_fsdp2_compiled_training_matches_eager():
    results = _run("fsdp2_train", timeout=300.0)
    for r in results:
        eager, compiled = r["losses"]["eager"], r["losses"]["compiled"]
        assert len(eager) == 3
        assert r["losses"]["eager_mesh_kept"] == [1.0] and r["losses"]["compiled_mesh_kept"] == [1.0], r
        for a, b in zip(eager, compiled, strict=True):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), r
