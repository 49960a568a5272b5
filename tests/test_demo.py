"""The demo of ``python -m opaque_subclass`` (2 local processes training a
sharded MLP under torch.compile), its launcher's failure handling, and the CLI."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch.distributed as dist

from opaque_subclass import cli
from opaque_subclass.sharded import demo
from opaque_subclass.testing import workers

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this build")


def test_demo_trains_matches_and_reuses_the_graph_on_a_new_mesh():
    t0 = time.monotonic()
    report = demo.run_demo(steps=5, world_size=2, timeout=110)
    elapsed = time.monotonic() - t0
    assert elapsed < 110, f"the demo took {elapsed:.0f} s"
    assert report.loss_error <= 1e-5 and report.eager_loss_error <= 1e-5 and report.weight_error <= 1e-5
    assert report.compilations_mesh_a == 1 and report.compilations_mesh_b == 0
    assert report.groups_mesh_a and report.groups_mesh_b and not set(report.groups_mesh_a) & set(report.groups_mesh_b)
    assert report.last_loss < report.first_loss
    assert report.failures(1e-5) == []
    line = report.lines()[0]
    assert line.startswith(f"torch {report.torch_version}, mode {report.mode}, world size 2, steps 5")
    assert "compilations 1 (mesh A) + 0 (mesh B)" in line and "step time compiled" in line


def test_report_failures_name_what_broke():
    report = demo.DemoReport(
        torch_version="x",
        mode="native",
        world_size=2,
        steps=5,
        backend="aot_eager",
        compilations_mesh_a=1,
        compilations_mesh_b=1,
        loss_error=1e-3,
        eager_loss_error=0.0,
        weight_error=0.0,
        compiled_step_s=0.001,
        eager_step_s=0.002,
        first_step_s=1.0,
        groups_mesh_a=("0",),
        groups_mesh_b=("0",),
        collectives_per_step=5,
        first_loss=1.0,
        last_loss=0.5,
        seconds=10.0,
    )
    problems = report.failures(1e-5)
    assert len(problems) == 3
    assert "differs from the unsharded reference by 0.001" in problems[0]
    assert "recompiled 1 time(s) for mesh B" in problems[1]
    assert "did not use mesh B's group" in problems[2]


def failing(rank: int, world_size: int, payload: dict[str, Any]) -> None:
    if rank == 1:
        raise RuntimeError("rank 1 broke on purpose")
    dist.barrier()  # waits for rank 1, which never comes


def sleeping(rank: int, world_size: int, payload: dict[str, Any]) -> None:
    time.sleep(600)


def echo(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "payload": payload}


def test_launcher_returns_results_by_rank():
    assert workers.run_local_workers(f"{__file__}:echo", 2, payload={"a": 1}, timeout=60) == [
        {"rank": 0, "world": 2, "payload": {"a": 1}},
        {"rank": 1, "world": 2, "payload": {"a": 1}},
    ]


def test_launcher_reports_the_failing_rank_without_waiting_for_its_peers():
    t0 = time.monotonic()
    with pytest.raises(workers.WorkersFailed, match=r"(?s)rank 1 failed:.*RuntimeError: rank 1 broke on purpose"):
        workers.run_local_workers(f"{__file__}:failing", 2, timeout=100)
    assert time.monotonic() - t0 < 40  # the peer stuck in a barrier was stopped, not waited for


TARGETS = str(__import__("pathlib").Path(__file__).with_name("launcher_targets.py"))


def test_launcher_sees_a_rank_dying_before_the_rendezvous_at_once():
    # Rank 0 waits at the rendezvous (its store would time out after 60 s);
    # the launcher must see rank 1's exit, blame rank 1, and stop rank 0.
    t0 = time.monotonic()
    with pytest.raises(workers.WorkersFailed) as info:
        workers.run_local_workers(f"{TARGETS}:die_at_import", 2, timeout=100)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert msg.startswith(f"{TARGETS}:die_at_import: rank 1 exited with code 3 without a result"), msg
    assert "then rank 0 was still running and was stopped by the launcher" in msg
    assert elapsed < 20, elapsed  # start-up of two interpreters plus 1 s of grace; was 62-78 s


def test_launcher_names_a_rank_killed_mid_run_and_its_signal():
    with pytest.raises(workers.WorkersFailed) as info:
        workers.run_local_workers(f"{TARGETS}:killed_mid_run", 2, timeout=100)
    msg = str(info.value)
    assert msg.startswith(f"{TARGETS}:killed_mid_run: rank 1 was killed by SIGKILL"), msg
    assert "rank 0 failed" not in msg.splitlines()[0]


def _workers_alive(marker: str) -> list[str]:
    """Command lines of this process's child processes that are launcher
    workers whose target contains ``marker`` (other test processes on the
    machine may run the same targets)."""
    import os
    import pathlib

    alive = []
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        text = b" ".join(args).decode(errors="replace")
        if parent == os.getpid() and "--worker" in text and marker in text:
            alive.append(text)
    return alive


@pytest.mark.parametrize("target", ["die_at_import", "killed_mid_run"])
def test_launcher_leaves_no_process_behind(target):
    with pytest.raises(workers.WorkersFailed):
        workers.run_local_workers(f"{TARGETS}:{target}", 2, timeout=100)
    assert _workers_alive(f"launcher_targets.py:{target}") == []


def test_launcher_bounds_the_run():
    t0 = time.monotonic()
    with pytest.raises(workers.WorkersFailed, match="2 workers did not finish within 8 s"):
        workers.run_local_workers(f"{__file__}:sleeping", 2, timeout=8)
    assert time.monotonic() - t0 < 20


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size 3 does not divide the layer widths"):
        demo.run_demo(world_size=3)
    with pytest.raises(ValueError, match="steps must be at least 2"):
        demo.run_demo(steps=1)
    with pytest.raises(ValueError, match="must be 'package.module:function' or '/path/file.py:function'"):
        workers._load_target("no_colon")


@pytest.fixture
def no_checks(monkeypatch):
    import opaque_subclass.cli.selfcheck

    monkeypatch.setattr(opaque_subclass.cli.selfcheck, "run_checks", lambda: [])


def test_cli_no_demo_skips_it(no_checks, monkeypatch, capsys):
    monkeypatch.setattr(demo, "run_demo", lambda **_: pytest.fail("the demo ran despite --no-demo"))
    assert cli.main(["--no-demo"]) == 0
    assert "demo:" not in capsys.readouterr().out


def test_cli_exit_code_is_nonzero_when_the_demo_fails(no_checks, monkeypatch, capsys):
    def broken(**_: Any) -> None:
        raise demo.DemoError("demo failed: the compiled step recompiled 1 time(s) for mesh B, expected 0")

    monkeypatch.setattr(demo, "run_demo", broken)
    assert cli.main([]) == 1
    out = capsys.readouterr().out
    assert "  [FAIL] demo failed: the compiled step recompiled 1 time(s) for mesh B" in out
