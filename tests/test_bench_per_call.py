"""The paired per-call benchmark (benchmarks/bench_per_call.py) runs and checks what it times.

The figures are the benchmark's (benchmarks/README.md); here a small run on this leg, so the
script keeps working on every release, and its checks are shown to catch what they claim: an
output holding another call's mesh, wrong values, a compilation on fresh inputs.
"""

from __future__ import annotations

import importlib.util
import json
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
