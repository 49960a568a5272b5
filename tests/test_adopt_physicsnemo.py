"""The PhysicsNeMo preset on NVIDIA PhysicsNeMo itself (``nvidia-physicsnemo`` 2.2.x).

Collected only where PhysicsNeMo is installed (``python -m nox -s clients``;
the default legs test the stand-in, tests/test_adopt.py). Each scenario runs
in a fresh interpreter: importing ``physicsnemo.domain_parallel`` replaces
AOTAutograd's ``process_runtime_tangent`` for the whole process.

Eight ``DeviceMesh``es of one shape over eight fake process groups,
``ShardTensor.from_local(..., [Shard(0)])`` on each, ``t * 2 + 1`` compiled
once: stock, 7 of 8 outputs and gradients carry the first call's mesh;
adopted with :func:`opaque_subclass.adoption.physicsnemo_shard_tensor`, none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("physicsnemo") is None, reason="nvidia-physicsnemo is not installed"
)

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = textwrap.dedent(
    """
    import json, sys
    import torch, torch._dynamo.testing
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import opaque_subclass
    from physicsnemo.domain_parallel import ShardTensor

    backend, adopt = sys.argv[1], sys.argv[2] == "adopt"
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    meshes = [DeviceMesh.from_group(dist.new_group([0, 1]), "cpu") for _ in range(8)]


    def shard(local, mesh):
        return ShardTensor.from_local(local, mesh, [Shard(0)], sharding_shapes="chunk", global_shape=(8,))


    shard(torch.ones(4), meshes[0])  # its first construction sets ShardTensor._enable_shard_patches
    before = dict(vars(ShardTensor))
    adoption = opaque_subclass.adoption.physicsnemo_shard_tensor() if adopt else None


    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    f = torch.compile(lambda t: t * 2 + 1, backend=counter)
    out_meshes, grad_meshes, values = [], [], []
    for mesh in meshes:
        x = shard(torch.arange(4.0), mesh).detach().requires_grad_(True)
        out = f(x)
        out.backward(shard(torch.ones(4), mesh))
        out_meshes.append(next(i for i, m in enumerate(meshes) if m is out._spec.mesh))
        grad_meshes.append(next(i for i, m in enumerate(meshes) if m is x.grad._spec.mesh))
        values.append([out._local_tensor.tolist(), x.grad._local_tensor.tolist()])
    report = {
        "outputs": out_meshes,
        "gradients": grad_meshes,
        "values": values[0],
        "compilations": counter.frame_count,
        "flatten names": ShardTensor.from_local(
            torch.ones(4), meshes[0], [Shard(0)], sharding_shapes="chunk", global_shape=(8,)
        ).__tensor_flatten__()[0],
    }
    if adoption is not None:
        adoption.undo()
        after = dict(vars(ShardTensor))
        report["changed"] = sorted(k for k in before.keys() | after.keys() if before.get(k) is not after.get(k))
    dist.destroy_process_group()
    print("REPORT " + json.dumps(report))
    """
)


def _run(backend: str, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCENARIO, backend, mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert proc.returncode == 0 and line is not None, proc.stdout[-5000:] + proc.stderr[-20000:]
    return json.loads(line.removeprefix("REPORT "))  # type: ignore[no-any-return]  # a JSON object


def test_stock_shard_tensor_is_stale():
    report = _run("aot_eager", "stock")
    assert report["outputs"] == [0] * 8 and report["gradients"] == [0] * 8, report
    assert report["compilations"] == 1 and report["flatten names"] == ["_local_tensor"]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_adopted_shard_tensor_runs_on_each_calls_mesh(backend):
    report = _run(backend, "adopt")
    assert report["outputs"] == list(range(8)) and report["gradients"] == list(range(8)), report
    assert report["compilations"] == 1 and report["flatten names"] == ["_local_tensor", "_mesh"]
    assert report["values"] == [[1.0, 3.0, 5.0, 7.0], [2.0, 2.0, 2.0, 2.0]]
    assert report["changed"] == [], report["changed"]


def test_the_preset_refuses_another_release(monkeypatch):
    import importlib.metadata

    import opaque_subclass as osc

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.3.0")
    with pytest.raises(osc.OpaqueValueError, match=r"written against nvidia-physicsnemo 2\.2\.x, and 2\.3\.0"):
        osc.adoption.physicsnemo_shard_tensor()
    assert not osc.adoptions()
