"""Storage accounting, torch's memory tools, FSDP1 module-state sync and FSDP2
training with opaque-attribute subclasses (2 gloo processes on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings

import pytest
import torch
from subclasses import Mesh, MeshTensor, nested

import opaque_subclass as osc

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_workers.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(name: str, world: int = 2, timeout: float = 180.0) -> list[dict]:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, name, str(rank), str(world), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-3000:]
            line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
            results.append(json.loads(line[len("RESULT ") :]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def test_untyped_storages_walks_nested_and_skips_opaques():
    x = nested(3)
    storages = osc.untyped_storages(x)
    assert storages == {x._data._data._data.untyped_storage()}
    plain = torch.ones(2)
    assert osc.untyped_storages(plain) == {plain.untyped_storage()}
    with pytest.raises(TypeError, match="expects a tensor, got Mesh"):
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
        for a, b in zip(eager, compiled):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), r
