"""Compile once per job: a simulated job shares one compiled program across
its ranks (``opaque_subclass.testing.simulate_job``, torch's fake process
group), and the artifacts it leaves run correctly on real gloo ranks.

The full-size jobs (up to 8192 ranks) are in benchmarks/bench_job_compile.py.
The sharded job of docs/large_jobs.md (8 ranks as (dp=2, tp=4), ranks 0 and 7,
run by tests/test_docs.py with its output checked) is the suite's check that a
job compiles once: the first rank misses AOTAutograd's cache, the other loads
its artifact, nothing bypasses the cache, and each loaded graph runs its
collectives on the loading rank's own tp group (torch 2.11 pickles the sharded
weights whole into the key: without the library's 2.11 key fix each rank
misses). Here: the launcher's checks, and the cached program on real gloo
ranks. Every process gets the test's own cache directory; no cache is turned
off.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opaque_subclass.sharded import ShardedTensor
from opaque_subclass.testing import run_local_workers, simulate_job, spread_ranks

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_job_compile.py"
WORKERS = Path(__file__).resolve().parent / "dist_workers.py"


def test_spread_ranks_puts_no_two_ranks_in_one_group():
    ranks = spread_ranks((1024, 8), 4)
    assert ranks[0] == 0 and ranks[-1] == 8191
    coordinates = [(r // 8, r % 8) for r in ranks]
    assert len({c[0] for c in coordinates}) == 4 and len({c[1] for c in coordinates}) == 4
    assert spread_ranks((16,), 3) == sorted(set(spread_ranks((16,), 3)))
    with pytest.raises(ValueError, match="between 1 and 16"):
        spread_ranks((4, 4), 17)


def test_simulate_job_refuses_a_mesh_that_is_not_the_world():
    with pytest.raises(ValueError, match=r"mesh_shape \(4, 8\) has 32 ranks, not world_size=16"):
        simulate_job(f"{BENCH}:sharded_step", 16, (4, 8))


def test_the_cached_program_trains_like_eager_on_real_ranks(tmp_path, monkeypatch):
    """A one-rank simulated job fills the cache; four real gloo ranks then load
    the program (no rank compiles it), run it on their own groups, and train
    exactly as the same model does eagerly."""
    cache = tmp_path / "cache"
    filled = simulate_job(f"{BENCH}:sharded_step", 4, (2, 2), ("dp", "tp"), ranks=[0], cache_dir=cache)
    assert filled.aot_misses == 1
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    results = run_local_workers(
        f"{WORKERS}:job_cache_numerics", 4, payload={"benchmarks": str(BENCH.parent)}, timeout=300
    )
    for rank, result in enumerate(results):
        assert result["aot"] == [1, 0], (rank, result)
        assert result["groups"] == [result["own_group"]], (rank, result)
        assert result["compiled"] == pytest.approx(result["eager"], rel=1e-5, abs=1e-6), (rank, result)
        assert result["weight_diff"] < 1e-5, (rank, result)
    assert len({r["own_group"] for r in results}) == 2  # two tp groups
    assert results[0]["compiled"] == results[1]["compiled"]  # one dp replica: one loss


def test_the_2_11_key_holds_a_stable_hash_for_a_subclass_with_opaques():
    from subclasses import fake_world
    from torch.distributed.device_mesh import DeviceMesh

    from opaque_subclass.fixes.autograd_cache import StableSubclassKey, stable_subclass_inputs

    with fake_world(8):
        a = DeviceMesh("cpu", [0, 1, 2, 3])
        b = DeviceMesh("cpu", [0, 5, 6, 7])  # another rank map, rank 0 in both
        x = ShardedTensor.from_full(torch.randn(8, 2), a, 0)
        y = ShardedTensor.from_full(torch.randn(8, 2), b, 0)  # other data, other mesh, same shapes
        z = ShardedTensor.from_full(torch.randn(8, 3), a, 0)
        plain = [torch.ones(2), 3]
        assert stable_subclass_inputs(plain) is plain
        kx, ky, kz = (stable_subclass_inputs([t, 1])[0] for t in (x, y, z))
        assert isinstance(kx, StableSubclassKey)
        assert kx == ky  # neither the mesh's ranks nor the data are in the key
        assert kx != kz  # the shapes are
