"""The demo under torchrun: ``torchrun --nproc-per-node 2 -m opaque_subclass.cli.demo``.

torchrun is ``python -m torch.distributed.run``; each test runs it in a
subprocess with ``--standalone``: torchrun's agent serves the rendezvous on a
port the kernel picks when the agent binds it, so no port is chosen before it
is bound. The failure test runs this file under
torchrun: its ``__main__`` block is the demo's entry with the per-rank function
replaced by one whose rank 1 raises while rank 0 waits for it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this build")


def _torchrun(
    target: list[str], tmp_path: Path, timeout: float = 170
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)  # torchrun sets them for its ranks
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--standalone",
        *target,
    ]
    t0 = time.monotonic()
    proc = subprocess.run(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    return proc, time.monotonic() - t0


def test_torchrun_runs_the_demo(tmp_path):
    proc, _ = _torchrun(["-m", "opaque_subclass.cli.demo"], tmp_path)
    assert proc.returncode == 0, proc.stdout
    passed = [line for line in proc.stdout.splitlines() if line.startswith("[PASS] torch ")]
    assert len(passed) == 1, proc.stdout  # rank 0 alone prints the report
    assert ", world size 2, steps 5 per mesh, compilations 1 (mesh A) + 0 (mesh B)," in passed[0], proc.stdout
    assert "ran on process group 0 (mesh A), then 1 (mesh B)" in proc.stdout


def failing_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    dist.barrier()  # both ranks joined the group
    if rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    dist.barrier()  # rank 0 waits for rank 1, which never comes
    return {}


def _summary_entry(output: str, rank: int) -> str:
    """The entry of ``rank`` in torchrun's failure summary (``[i]:`` then
    ``time``, ``host``, ``rank``, ``exitcode``, ``error_file``, ``traceback``)."""
    summary = output.partition("ChildFailedError")[2]
    entries = re.split(r"(?m)^\[\d+\]:$", summary)[1:]
    mine = [e for e in entries if re.search(rf"(?m)^\s*rank\s*: {rank} \(local_rank: {rank}\)$", e)]
    assert len(mine) == 1, f"no single entry for rank {rank} in torchrun's summary:\n{output}"
    return mine[0]


def test_a_failing_rank_fails_the_command_and_shows_its_error(tmp_path):
    proc, elapsed = _torchrun([__file__], tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "[PASS]" not in proc.stdout
    # the rank's traceback in torchrun's summary, from the error file the
    # demo's entry writes before it leaves the group (the rank's own stderr may
    # be cut short: torchrun stops the ranks once one of them has failed)
    assert "RuntimeError: rank 1 broke on purpose" in _summary_entry(proc.stdout, 1), proc.stdout
    # rank 0 must not sit in its barrier until the process group's 60 s timeout
    assert elapsed < 50, f"{elapsed:.0f} s\n{proc.stdout}"


if __name__ == "__main__":  # one rank under torchrun, for the failure test
    from opaque_subclass.cli import demo

    demo.train_worker = failing_worker  # the per-rank function the demo's entry runs
    sys.exit(demo.main([]))
