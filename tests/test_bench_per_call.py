"""The paired per-call benchmark (benchmarks/bench_per_call.py) runs and checks what it times.

The figures are the benchmark's (benchmarks/README.md); here a small run on this leg, so the
script keeps working on every release, and its checks are shown to catch what they claim: an
output holding another call's mesh, wrong values, a compilation on fresh inputs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opaque_subclass

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_per_call.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_per_call", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_per_call"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_per_call", None)
    opaque_subclass.enable()


def test_a_small_run_times_every_cell_and_writes_its_ratios(bench, tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--ks", "1,2", "--backends", "aot_eager", "--passes", "fw,fwbw", "--variants", "own,nested"]
    code = bench.main([*argv, "--rounds", "3", "--target-ms", "1", "--warmup", "1", "--json", str(out)])
    assert code == 0
    assert opaque_subclass.support().mode in ("backport", "native")  # enabled again after the stock cells
    report = json.loads(out.read_text())
    assert report["torch"] == torch.__version__
    rows = report["rows"]
    assert [(r["variant"], r["k"], r["pass"]) for r in rows] == [
        (v, k, p) for p in ("fw", "fwbw") for v in ("own", "nested") for k in (1, 2)
    ]
    stock = report["mode"] != "backport"  # torch 2.11 has no native path to compare with
    for row in rows:
        assert row["error"] is None
        assert len(row["ours_s"]) == len(row["floor_s"]) == 3
        assert 0 < row["ours/floor"]["q1"] <= row["ours/floor"]["median"] <= row["ours/floor"]["q3"]
        assert ("stock_s" in row) is stock and ("ours/stock" in row) is stock


def test_the_checks_catch_another_calls_mesh_wrong_values_and_recompiles(bench):
    config = bench.Config("own", 2, "aot_eager", "fw")

    def honest(given):
        return [bench.Sharded(x._data + 1, x._mesh) for x in given.args], None

    bench._check(config, honest, lambda: 0)

    stale = bench.Mesh("stale")
    with pytest.raises(bench.CheckFailed, match="another call's mesh"):
        bench._check(config, lambda g: ([bench.Sharded(x._data + 1, stale) for x in g.args], None), lambda: 0)
    with pytest.raises(bench.CheckFailed, match="wrong output values"):
        bench._check(config, lambda g: ([bench.Sharded(x._data, x._mesh) for x in g.args], None), lambda: 0)
    counts = iter(range(10))
    with pytest.raises(bench.CheckFailed, match="compiled again"):
        bench._check(config, honest, lambda: next(counts))


def test_the_bounds_are_the_issues(bench):
    config = bench.Config("own", 64, "aot_eager", "fw")
    cell = bench.Cell("ours", lambda: None, times=[1.06, 1.06, 1.06])
    floor = bench.Cell("floor", lambda: None, times=[1.0, 1.0, 1.0])
    row = bench.Row(config, floor, cell, None, None, {})
    assert bench.bounds_failures([row], 0.0) == [f"{config.label}: ours/floor 1.060 > 1.05"]
    assert bench.bounds_failures([row], 0.02) == []
    small = bench.Row(bench.Config("own", 8, "aot_eager", "fw"), floor, cell, None, None, {})
    assert bench.bounds_failures([small], 0.0) == [f"{small.config.label}: ours/floor 1.060 > 1.02"]


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None, reason="no valgrind")
@pytest.mark.skipif(
    not torch.__version__.startswith("2.15."),
    reason="about 2 minutes under valgrind, on the newest leg only (the counting is the script's, the same on every leg)",
)
def test_instructions_are_counted_under_callgrind_and_repeat(tmp_path):
    """``--instructions``: the script runs itself under callgrind and reports per-call machine
    instructions of every cell, less an empty loop's; the counts of two rounds agree."""
    out = tmp_path / "instructions.json"
    argv = ["--ks", "8", "--variants", "own", "--backends", "aot_eager", "--passes", "fw"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *argv, "--instructions", "5", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),  # its own, never the worker's
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "machine instructions per call (callgrind)" in done.stdout
    report = json.loads(out.read_text())
    assert report["unit"] == "instructions" and report["calls_per_count"] == 5 and report["rounds"] == 2
    (row,) = report["rows"]
    cells = ["floor", "ours"] + (["stock"] if report["mode"] != "backport" else [])
    for name in cells:
        counts = row[f"{name}_s"]
        assert len(counts) == 2 and all(200_000 < c < 10_000_000 for c in counts), (name, counts)
        assert abs(counts[0] - counts[1]) < 0.05 * counts[0], (name, counts)  # repeats, bar the allocator's state
    assert 0.8 < row["ours/floor"]["median"] < 1.5
