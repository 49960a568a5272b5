"""Inductor's pool of compile workers, with opaques.

The suite compiles in the asking process (tests/conftest.py sets
``TORCHINDUCTOR_COMPILE_THREADS=1`` unless the caller chose otherwise), which on a
2-core machine is faster for its small graphs. Users on machines with more cores
get inductor's default, a pool of compile worker processes: this test keeps that
path covered on every leg, in a fresh interpreter whose inductor has two compile
threads. Forward and backward of a subclass with an opaque, compiled once, must
return each call's own object and eager's values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent(
    """
    import json
    import torch, torch._dynamo.testing
    from torch._inductor.async_compile import AsyncCompile
    import opaque_subclass
    from subclasses import Mesh, MeshTensor

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")

    @torch.compile(backend=counter, fullgraph=True)
    def step(x):
        return (x * 3).sin() + 1

    # start the pool and wait until it takes work, so that the kernels are compiled there
    AsyncCompile.use_process_pool()
    if AsyncCompile._ready_future is not None:
        AsyncCompile._ready_future.result(timeout=120)
    report = {"threads": torch._inductor.config.compile_threads, "pool": AsyncCompile.use_process_pool()}
    calls = []
    for name in ("a", "b"):
        mesh = Mesh(name)
        data = torch.arange(4.0)
        x = MeshTensor(data, mesh).requires_grad_(True)
        out = step(x)
        out.sum().backward()
        calls.append({
            "own_mesh": out._mesh is mesh and x.grad._mesh is mesh,
            "values": torch.allclose(out._data, (data * 3).sin() + 1),
            "grad": torch.allclose(x.grad._data, 3 * (data * 3).cos()),
        })
    report["calls"] = calls
    report["frames"] = counter.frame_count
    print(json.dumps(report))
    """
)


def test_inductor_with_its_pool_of_compile_workers_keeps_each_calls_opaque(tmp_path):
    env = {
        **os.environ,
        "TORCHINDUCTOR_COMPILE_THREADS": "2",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["threads"] == 2 and report["pool"] is True, report  # the pool path, not in-process
    assert report["calls"] == [{"own_mesh": True, "values": True, "grad": True}] * 2, report
    assert report["frames"] == 1, report  # one compilation serves both meshes
