"""Simulate the compilation of a large distributed job on one machine.

Every rank of a ``world_size`` job compiles the same program. Whether it
compiles *once per job* (the first rank misses torch's compile caches, later
ranks load the artifact from a shared cache directory) or once per rank
depends on what the program bakes in: a collective naming its group by a
constant string, a mesh hashed by value into a cache key, a guard on a rank map.
:func:`simulate_job` measures it without a cluster: one fresh process per
*sampled* rank, one after the other, each on torch's fake process group
(``torch.testing._internal.distributed.fake_pg``: any world size, no
communication) with a real ``DeviceMesh`` of the job's shape, all sharing one
``TORCHINDUCTOR_CACHE_DIR``. It reports each rank's compilations, AOTAutograd
and FX graph cache hits, misses and bypasses (with torch's reasons) and compile
seconds::

    from opaque_subclass.testing import simulate_job

    report = simulate_job("my_model.py:train_step", world_size=8192, mesh_shape=(1024, 8),
                          mesh_dim_names=("dp", "tp"))
    print(report.table())
    assert report.aot_misses == 1   # compiled once for the whole job

The step ``fn(mesh, payload)`` (``"package.module:function"`` or
``"/path/file.py:function"``) gets the rank's ``DeviceMesh`` over the whole
world, builds its model, runs its compiled steps (forward and backward) and may
return a JSON-serializable value, kept per rank. Fake collectives move no data:
check numerics on real ranks (:func:`~opaque_subclass.testing.run_local_workers`).

A rank runs ``python -m opaque_subclass.testing._job_rank SPEC_FILE``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from opaque_subclass.testing import warm
from opaque_subclass.testing.workers import _load_target

__all__ = ["JobReport", "RankReport", "simulate_job", "spread_ranks"]

_N = TypeVar("_N", int, float)

_ENTRY_MODULE = "opaque_subclass.testing._job_rank"
_RESULT_MARK = "opaque-subclass-job-rank:"


@dataclass(frozen=True)
class RankReport:
    """What one simulated rank compiled, and how torch's caches served it."""

    rank: int
    coordinate: tuple[int, ...]
    compilations: int  # graphs Dynamo compiled (torch's counters["stats"]["unique_graphs"])
    aot_hits: int
    aot_misses: int
    aot_bypasses: int
    fx_hits: int
    fx_misses: int
    fx_bypasses: int
    compile_seconds: float  # Dynamo's compile time, forward and backward (torch's compilation_time_metrics)
    step_seconds: float  # wall time of the whole step function
    bypass_reasons: tuple[str, ...] = ()
    value: Any = None  # what the step function returned

    def line(self) -> str:
        reasons = f"  bypass: {self.bypass_reasons[0]}" if self.bypass_reasons else ""
        return (
            f"rank {self.rank:>5} {self.coordinate!s:<12} graphs {self.compilations}  "
            f"aot hit/miss/bypass {self.aot_hits}/{self.aot_misses}/{self.aot_bypasses}  "
            f"fx {self.fx_hits}/{self.fx_misses}/{self.fx_bypasses}  compile {self.compile_seconds:6.2f} s{reasons}"
        )


class _Summed(Generic[_N]):
    """A :class:`JobReport` attribute: the :class:`RankReport` field of its name
    summed over the sampled ranks."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, report: None, owner: type) -> _Summed[_N]: ...
    @overload
    def __get__(self, report: JobReport, owner: type) -> _N: ...
    def __get__(self, report: JobReport | None, owner: type) -> _Summed[_N] | _N:
        if report is None:
            return self
        return sum(getattr(r, self.name) for r in report.ranks)  # type: ignore[no-any-return]  # the fields are _N


@dataclass(frozen=True)
class JobReport:
    """The sampled ranks of one simulated job, in the order they ran."""

    step: str
    world_size: int
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...] | None
    ranks: tuple[RankReport, ...] = field(default_factory=tuple)

    compilations = _Summed[int]()
    aot_hits = _Summed[int]()
    aot_misses = _Summed[int]()
    aot_bypasses = _Summed[int]()
    fx_misses = _Summed[int]()
    compile_seconds = _Summed[float]()

    def summary(self) -> str:
        """One line: the job's AOTAutograd cache outcome, summed over its sampled ranks."""
        return (
            f"W={self.world_size} mesh={self.mesh_shape} ranks={[r.rank for r in self.ranks]}: "
            f"aot hit/miss/bypass {self.aot_hits}/{self.aot_misses}/{self.aot_bypasses}, "
            f"fx misses {self.fx_misses}, graphs {self.compilations}, compile {self.compile_seconds:.1f} s"
        )

    def table(self) -> str:
        """The summary, then a line per sampled rank."""
        return "\n".join([self.summary(), *(f"  {r.line()}" for r in self.ranks)])


def _coordinate(rank: int, mesh_shape: Sequence[int]) -> tuple[int, ...]:
    coordinate = []
    for size in reversed(mesh_shape):
        coordinate.append(rank % size)
        rank //= size
    return tuple(reversed(coordinate))


def spread_ranks(mesh_shape: Sequence[int], count: int = 4) -> list[int]:
    """``count`` ranks spread over a row-major mesh of ``mesh_shape``: the
    first and the last rank, and ranks between them whose coordinates differ
    from each other's on every dimension as far as the mesh allows (so that no
    two share a data-parallel or a tensor-parallel group)."""
    world = 1
    for size in mesh_shape:
        world *= size
    if count < 1 or count > world:
        raise ValueError(f"spread_ranks: count must be between 1 and {world} (the mesh's ranks), got {count}")
    ranks: list[int] = []
    for i in range(count):
        coordinate = [
            (size - 1) if i == count - 1 and count > 1 else (i * size // count + i) % size for size in mesh_shape
        ]
        rank = 0
        for c, size in zip(coordinate, mesh_shape, strict=True):
            rank = rank * size + c
        while rank in ranks:  # a small mesh: take the next free rank
            rank = (rank + 1) % world
        ranks.append(rank)
    return ranks


def simulate_job(
    step: str,
    world_size: int,
    mesh_shape: Sequence[int] | None = None,
    mesh_dim_names: Sequence[str] | None = None,
    *,
    ranks: Sequence[int] | None = None,
    payload: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900.0,
) -> JobReport:
    """Run ``step`` in one fresh process per sampled rank of a ``world_size`` job, sharing one
    compile cache directory, and report what each compiled.

    Parameters
    ----------
    step
        ``"package.module:function"`` or ``"/path/file.py:function"``, called as ``fn(mesh, payload)``.
    world_size, mesh_shape, mesh_dim_names
        The job; ``mesh_shape`` defaults to ``(world_size,)`` and its product must be ``world_size``.
    ranks
        The ranks to run, in order (default: :func:`spread_ranks`, 4 ranks).
    payload
        JSON-serializable arguments for the step.
    cache_dir
        The shared ``TORCHINDUCTOR_CACHE_DIR`` (default: a fresh temporary directory, removed
        afterwards); pass one to simulate a job finding an earlier job's artifacts.
    env
        Extra environment variables for the rank processes.
    timeout
        Seconds for each rank.

    Raises
    ------
    ValueError
        If the mesh does not match the world size or a rank is out of range.
    RuntimeError
        If a rank fails or times out; the message holds its output.
    """
    shape = tuple(mesh_shape) if mesh_shape is not None else (world_size,)
    product = 1
    for size in shape:
        product *= size
    if product != world_size:
        raise ValueError(f"simulate_job: mesh_shape {shape} has {product} ranks, not world_size={world_size}")
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    if names is not None and len(names) != len(shape):
        raise ValueError(f"simulate_job: mesh_dim_names {names} do not match mesh_shape {shape}")
    chosen = list(ranks) if ranks is not None else spread_ranks(shape, min(4, world_size))
    bad = [r for r in chosen if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"simulate_job: ranks {bad} are outside the world of {world_size} ranks")
    package_root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="opaque_subclass_job_") as workdir:
        cache = str(cache_dir) if cache_dir is not None else str(Path(workdir, "cache"))
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env["TORCHINDUCTOR_CACHE_DIR"] = cache
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, child_env.get("PYTHONPATH", "")) if p)
        child_env.setdefault("OMP_NUM_THREADS", "1")
        reports = []
        for rank in chosen:
            spec = {
                "step": step,
                "rank": rank,
                "world_size": world_size,
                "mesh_shape": list(shape),
                "mesh_dim_names": list(names) if names is not None else None,
                "payload": dict(payload or {}),
            }
            spec_file = Path(workdir, f"rank{rank}.json")
            spec_file.write_text(json.dumps(spec))
            started = time.monotonic()
            try:
                # forked by the WarmInterpreters entered around the call, else a new interpreter
                done = warm.run([sys.executable, "-m", _ENTRY_MODULE, str(spec_file)], env=child_env, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                out, err = (_text(e.stdout), _text(e.stderr))
                raise RuntimeError(
                    f"simulate_job: rank {rank} of {world_size} ran longer than {timeout:.0f} s; "
                    f"output tail:\n{out[-2000:]}{err[-2000:]}"
                ) from None
            result = _parse(done.stdout)
            if done.returncode != 0 or result is None:
                raise RuntimeError(
                    f"simulate_job: rank {rank} of {world_size} failed (exit {done.returncode}, "
                    f"{time.monotonic() - started:.1f} s); output tail:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
                )
            result["coordinate"] = tuple(result["coordinate"])
            result["bypass_reasons"] = tuple(result["bypass_reasons"])
            reports.append(RankReport(**result))
    return JobReport(step, world_size, shape, names, tuple(reports))


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _parse(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_RESULT_MARK):
            parsed: dict[str, Any] = json.loads(line[len(_RESULT_MARK) :])
            return parsed
    return None


def _run_rank(spec_file: str) -> int:
    """One rank: join a fake world, build the mesh, run the step, print the counters."""
    import logging

    import torch.distributed as dist
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    spec = json.loads(Path(spec_file).read_text())
    rank, world_size = spec["rank"], spec["world_size"]
    reasons: list[str] = []

    class _Bypasses(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "ypass" in message and len(reasons) < 8:
                reasons.append(message.splitlines()[0][:300])

    handler = _Bypasses(logging.INFO)
    watched = [
        logging.getLogger(n) for n in ("torch._functorch._aot_autograd.autograd_cache", "torch._inductor.codecache")
    ]
    for logger in watched:
        logger.addHandler(handler)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    fn = _load_target(spec["step"])
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        names = spec["mesh_dim_names"]
        mesh = init_device_mesh("cpu", tuple(spec["mesh_shape"]), mesh_dim_names=tuple(names) if names else None)
        coordinate = mesh.get_coordinate()
        started = time.perf_counter()
        value = fn(mesh, spec["payload"])
        step_seconds = time.perf_counter() - started
    finally:
        dist.destroy_process_group()
    compile_seconds = sum(
        sum(times)
        for key, times in compilation_time_metrics.items()
        if key == "_compile.compile_inner" or "bw_compiler" in key
    )
    aot, inductor = counters["aot_autograd"], counters["inductor"]
    result = {
        "rank": rank,
        "coordinate": list(coordinate or ()),
        "compilations": int(counters["stats"]["unique_graphs"]),
        "aot_hits": int(aot["autograd_cache_hit"]),
        "aot_misses": int(aot["autograd_cache_miss"]),
        "aot_bypasses": int(aot["autograd_cache_bypass"]),
        "fx_hits": int(inductor["fxgraph_cache_hit"]),
        "fx_misses": int(inductor["fxgraph_cache_miss"]),
        "fx_bypasses": int(inductor["fxgraph_cache_bypass"]),
        "compile_seconds": round(compile_seconds, 3),
        "step_seconds": round(step_seconds, 3),
        "bypass_reasons": reasons,
        "value": value,
    }
    sys.stdout.write(_RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0
