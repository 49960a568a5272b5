"""The demo of ``python -m opaque_subclass``: tensor-parallel training with
:class:`~opaque_subclass.sharded.ShardedTensor` under torch.compile, in local
processes joined by a gloo process group on 127.0.0.1.

Each rank trains a small MLP (16 -> 32 -> 32 -> 8) with sharded weights:
column-parallel, row-parallel (a collective in forward and one in backward),
column-parallel, the output compared with a replicated target. Each step runs
forward, loss and backward through ``torch.compile``, then an eager SGD update;
losses are compared with an unsharded eager reference from the same weights and
data. Then the weights move to a second mesh on a *new* process group and
training goes on with the same compiled function: no recompile, still matching,
and the collectives (recorded by :func:`~opaque_subclass.sharded.record_collectives`)
on the new group.

:func:`run_demo` starts the ranks with :func:`~opaque_subclass.testing.run_local_workers`.
Run as a module, the demo also works under torchrun, one rank per process::

    python -m opaque_subclass.cli.demo                          # its own 2 local workers
    torchrun --nproc-per-node 2 -m opaque_subclass.cli.demo     # torchrun's ranks

With torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) each rank joins a gloo group by env:// rendezvous and runs
:func:`train_worker` (:func:`run_rank`); rank 0 gathers, checks and prints the report.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict, cast

from opaque_subclass.testing.workers import WorkersFailed, run_local_workers

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed import ProcessGroup
    from typing_extensions import Unpack

    from opaque_subclass.sharded.tensor import ShardedTensor

__all__ = [
    "MLP_PLAN",
    "DemoError",
    "DemoReport",
    "run_demo",
    "run_rank",
    "train_worker",
]

log = logging.getLogger(__name__)

#: Shard dim of each parameter of the demo MLP (``None``: replicated).
MLP_PLAN: dict[str, int | None] = {
    "0.weight": 0,
    "0.bias": 0,  # column-parallel: output features split
    "2.weight": 1,
    "2.bias": None,  # row-parallel: contraction over the split, all-reduce
    "4.weight": 0,
    "4.bias": 0,  # column-parallel again: the output stays split
}


class DemoError(RuntimeError):
    """The demo failed (a rank failed, or the results are wrong); the message says how."""

    def __init__(self, message: str, report: DemoReport | None = None) -> None:
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------- the demo


def _mlp() -> nn.Sequential:
    import torch.nn as nn

    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))


def _loss(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(x)
    return ((out - target) ** 2).mean()


def _train(
    model: nn.Module, step_fn: Callable[..., torch.Tensor], data: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float
) -> tuple[list[float], list[float]]:
    import torch

    losses, times = [], []
    for x, target in data:
        t0 = time.perf_counter()
        loss = step_fn(model, x, target)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(cast("torch.Tensor", p.grad), alpha=lr)  # backward gave every parameter a grad
                p.grad = None
        times.append(time.perf_counter() - t0)
        losses.append(
            float(cast("ShardedTensor", loss.detach()).full_tensor() if hasattr(loss, "full_tensor") else loss.detach())
        )
    return losses, times


def train_worker(rank: int, world_size: int, payload: Mapping[str, Any]) -> dict[str, Any]:
    """One rank of the demo (see the module docstring), in a process group already joined:
    run by :func:`run_local_workers` for :func:`run_demo`, and by :func:`run_rank` under torchrun."""
    import torch
    import torch._dynamo
    import torch._dynamo.testing
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    import opaque_subclass
    from opaque_subclass.sharded.plan import shard_module
    from opaque_subclass.sharded.tensor import record_collectives

    torch.set_num_threads(1)
    steps, backend, lr = int(payload["steps"]), str(payload["backend"]), float(payload["lr"])
    torch.manual_seed(int(payload["seed"]))
    reference = _mlp()
    initial = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    data = [(torch.randn(8, 16), torch.randn(8, 8)) for _ in range(2 * steps)]
    ref_losses, _ = _train(reference, _loss, data, lr)

    mesh_a = init_device_mesh("cpu", (world_size,))
    eager = shard_module(_fresh_mlp(initial), mesh_a, MLP_PLAN)
    eager_losses, eager_times = _train(eager, _loss, data[:steps], lr)

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(_loss, backend=counter, fullgraph=True)
    model = shard_module(_fresh_mlp(initial), mesh_a, MLP_PLAN)
    with record_collectives() as seen_a:
        losses_a, times_a = _train(model, compiled, data[:steps], lr)
    frames_a = counter.frame_count

    group_b = cast("ProcessGroup", dist.new_group(list(range(world_size))))  # every rank is a member
    mesh_b = DeviceMesh.from_group(group_b, "cpu")
    model = shard_module(model, mesh_b, MLP_PLAN)  # the trained weights, now on mesh B
    with record_collectives() as seen_b:
        losses_b, times_b = _train(model, compiled, data[steps:], lr)
    frames_b = counter.frame_count - frames_a

    ref_params = dict(reference.named_parameters())
    weight_error = max(
        float((cast("ShardedTensor", p.detach()).full_tensor() - ref_params[n].detach()).abs().max())
        for n, p in model.named_parameters()  # shard_module made every parameter a ShardedTensor
    )
    compiled_losses = losses_a + losses_b
    return {
        "torch_version": torch.__version__,
        "mode": opaque_subclass.support().mode,
        "frames_a": frames_a,
        "frames_b": frames_b,
        "loss_error": max(abs(a - b) for a, b in zip(compiled_losses, ref_losses, strict=True)),
        "eager_loss_error": max(abs(a - b) for a, b in zip(eager_losses, ref_losses[:steps], strict=True)),
        "weight_error": weight_error,
        "compiled_step_s": statistics.median(times_a[1:] + times_b),
        "eager_step_s": statistics.median(eager_times[1:] or eager_times),
        "first_step_s": times_a[0],
        "groups_a": sorted({r.group_name for r in seen_a}),
        "groups_b": sorted({r.group_name for r in seen_b}),
        "group_b": str(group_b.group_name),
        "collectives_per_step": len(seen_b) // max(len(losses_b), 1),
        "losses": compiled_losses,
    }


def _fresh_mlp(state: Mapping[str, torch.Tensor]) -> nn.Sequential:
    model = _mlp()
    model.load_state_dict(state)
    return model


@dataclass(frozen=True)
class DemoReport:
    """What the demo measured (errors are maxima over steps and ranks)."""

    torch_version: str
    mode: str
    world_size: int
    steps: int
    backend: str
    compilations_mesh_a: int
    compilations_mesh_b: int
    loss_error: float  # max |compiled sharded loss - unsharded eager loss|, both meshes
    eager_loss_error: float  # the same for the sharded model run eagerly
    weight_error: float  # max |trained sharded weight - reference weight| at the end
    compiled_step_s: float  # median seconds per training step after the first
    eager_step_s: float
    first_step_s: float  # the first compiled step, compilation included
    groups_mesh_a: tuple[str, ...]  # process groups the collectives used, recorded as they ran
    groups_mesh_b: tuple[str, ...]
    collectives_per_step: int
    first_loss: float
    last_loss: float
    seconds: float  # wall time of the whole demo

    def failures(self, tolerance: float) -> list[str]:
        """The demo's requirements that this report breaks (empty when it passed)."""
        problems = []
        if max(self.loss_error, self.eager_loss_error, self.weight_error) > tolerance:
            problems.append(
                f"sharded training differs from the unsharded reference by {max(self.loss_error, self.eager_loss_error, self.weight_error):.3g} "
                f"(loss {self.loss_error:.3g}, eager loss {self.eager_loss_error:.3g}, weights {self.weight_error:.3g}), "
                f"more than {tolerance:g}"
            )
        if self.compilations_mesh_a != 1:
            problems.append(f"{self.compilations_mesh_a} compilations on mesh A, expected 1")
        if self.compilations_mesh_b != 0:
            problems.append(f"the compiled step recompiled {self.compilations_mesh_b} time(s) for mesh B, expected 0")
        if not self.groups_mesh_b or set(self.groups_mesh_b) & set(self.groups_mesh_a):
            problems.append(
                f"collectives on mesh B ran on process group(s) {list(self.groups_mesh_b)}, mesh A's were "
                f"{list(self.groups_mesh_a)}: the compiled graph did not use mesh B's group"
            )
        return problems

    def lines(self) -> list[str]:
        """The human-readable report."""
        return [
            f"torch {self.torch_version}, mode {self.mode}, world size {self.world_size}, steps {self.steps} per mesh, "
            f"compilations {self.compilations_mesh_a} (mesh A) + {self.compilations_mesh_b} (mesh B), "
            f"max |loss - reference| {self.loss_error:.1e}, step time compiled {self.compiled_step_s * 1e3:.1f} ms "
            f"vs eager {self.eager_step_s * 1e3:.1f} ms.",
            f"backend {self.backend}; loss {self.first_loss:.4f} -> {self.last_loss:.4f}; "
            f"max |weight - reference| {self.weight_error:.1e}; {self.collectives_per_step} mesh ops per step ran on "
            f"process group {'/'.join(self.groups_mesh_a)} (mesh A), then {'/'.join(self.groups_mesh_b)} (mesh B); "
            f"first compiled step {self.first_step_s:.1f} s; demo {self.seconds:.1f} s.",
        ]


def _check_arguments(caller: str, steps: int, world_size: int) -> None:
    if steps < 2:
        raise ValueError(f"{caller}: steps must be at least 2 (the first compiled step is not timed), got {steps}")
    if world_size < 1 or 8 % world_size:
        raise ValueError(
            f"{caller}: world_size {world_size} does not divide the layer widths 32 and 8; use 1, 2, 4 or 8"
        )


def _report(
    results: Sequence[Mapping[str, Any]], *, steps: int, backend: str, tolerance: float, seconds: float
) -> DemoReport:
    """The report of the ranks' results (by rank); raises :class:`DemoError` if it breaks a requirement."""
    first = results[0]
    report = DemoReport(
        torch_version=first["torch_version"],
        mode=first["mode"],
        world_size=len(results),
        steps=steps,
        backend=backend,
        compilations_mesh_a=max(r["frames_a"] for r in results),
        compilations_mesh_b=max(r["frames_b"] for r in results),
        loss_error=max(r["loss_error"] for r in results),
        eager_loss_error=max(r["eager_loss_error"] for r in results),
        weight_error=max(r["weight_error"] for r in results),
        compiled_step_s=statistics.mean(r["compiled_step_s"] for r in results),
        eager_step_s=statistics.mean(r["eager_step_s"] for r in results),
        first_step_s=max(r["first_step_s"] for r in results),
        groups_mesh_a=tuple(sorted({g for r in results for g in r["groups_a"]})),
        groups_mesh_b=tuple(sorted({g for r in results for g in r["groups_b"]})),
        collectives_per_step=first["collectives_per_step"],
        first_loss=first["losses"][0],
        last_loss=first["losses"][-1],
        seconds=seconds,
    )
    problems = report.failures(tolerance)
    wrong_group = [i for i, r in enumerate(results) if list(r["groups_b"]) != [r["group_b"]]]
    if wrong_group:
        problems.append(f"rank(s) {wrong_group}: collectives on mesh B did not all run on mesh B's process group")
    if any(r["losses"] != first["losses"] for r in results[1:]):
        problems.append("the ranks saw different losses; a replicated value diverged between ranks")
    if problems:
        raise DemoError("demo failed: " + "; ".join(problems) + "\n" + "\n".join(report.lines()), report)
    return report


class _Options(TypedDict, total=False):
    """The demo's keywords besides ``timeout`` (:func:`run_demo`'s and :func:`run_rank`'s)."""

    backend: str
    lr: float
    seed: int
    tolerance: float


@dataclass(frozen=True)
class _Run:
    """One run of the demo: its settings (the defaults of :class:`_Options`) and when it started."""

    steps: int
    backend: str = "aot_eager"
    lr: float = 0.1
    seed: int = 0
    tolerance: float = 1e-5
    started: float = field(init=False, default_factory=time.perf_counter)

    def payload(self) -> dict[str, Any]:
        """What each rank's :func:`train_worker` gets."""
        return {"steps": self.steps, "backend": self.backend, "lr": self.lr, "seed": self.seed}

    def report(self, results: Sequence[Mapping[str, Any]]) -> DemoReport:
        seconds = time.perf_counter() - self.started
        return _report(results, steps=self.steps, backend=self.backend, tolerance=self.tolerance, seconds=seconds)


def run_demo(steps: int = 5, world_size: int = 2, *, timeout: float = 100.0, **options: Unpack[_Options]) -> DemoReport:
    """Run the sharded-MLP demo in ``world_size`` local processes; see the module docstring.

    Parameters
    ----------
    steps
        Training steps on each of the two meshes.
    world_size
        Number of processes; 32 and 8 (the layer widths) must divide by it.
    timeout
        Seconds for the whole run.
    backend
        The torch.compile backend, ``"aot_eager"`` (default, fast to compile) or ``"inductor"``.
    lr, seed
        SGD learning rate (default 0.1) and the seed of the weights and data (default 0).
    tolerance
        Largest accepted absolute difference from the unsharded reference (default 1e-5).

    Returns
    -------
    DemoReport

    Raises
    ------
    DemoError
        If a rank failed or timed out, or the report breaks a requirement (then in its ``report``).
    """
    _check_arguments("run_demo", steps, world_size)
    run = _Run(steps, **options)
    try:
        results = run_local_workers(
            "opaque_subclass.cli.demo:train_worker", world_size, payload=run.payload(), timeout=timeout
        )
    except WorkersFailed as e:
        raise DemoError(f"demo failed: {e}") from e
    return run.report(results)


#: The variables of an env:// rendezvous; torchrun sets them in every rank.
RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _launched_by_torchrun() -> bool:
    return all(name in os.environ for name in RENDEZVOUS_ENV)


def run_rank(steps: int = 5, *, timeout: float = 60.0, **options: Unpack[_Options]) -> DemoReport | None:
    """Run this process's rank of the demo under torchrun (or a launcher setting ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``).

    Joins a gloo group by env:// rendezvous, runs :func:`train_worker`, gathers the results on
    rank 0 and destroys the group (also on failure). Arguments are :func:`run_demo`'s, except
    ``timeout``: the seconds the rendezvous and each collective may wait, so a rank whose peer died
    fails instead of hanging. An error of :func:`train_worker` or the gather is written to this
    rank's torchrun error file (``torch.distributed.elastic``'s ``record``) before the group is
    destroyed, so torchrun's failure summary shows it even if torchrun stops this rank after a
    peer failed on losing its connection to it.

    Returns
    -------
    DemoReport or None
        The report on rank 0; ``None`` on the other ranks.

    Raises
    ------
    DemoError
        On rank 0, if the report breaks a requirement. An error of this rank
        (in :func:`train_worker`, or a collective timing out) propagates.
    """
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    missing = [name for name in RENDEZVOUS_ENV if name not in os.environ]
    if missing:
        raise RuntimeError(f"run_rank: {', '.join(missing)} not set; launch with torchrun (or use run_demo)")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _check_arguments("run_rank", steps, world_size)
    run = _Run(steps, **options)
    payload = run.payload()
    dist.init_process_group(
        "gloo", init_method="env://", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout)
    )

    def train_and_gather() -> list[Any] | None:
        result = train_worker(rank, world_size, payload)
        results: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(result, results, dst=0)
        return results

    try:
        results = record(train_and_gather)()
    finally:
        dist.destroy_process_group()
    if results is None:
        return None
    return run.report(results)


def _print_report(report: DemoReport) -> None:
    lines = report.lines()
    print("[PASS] " + lines[0])
    for line in lines[1:]:
        print("       " + line)


def _main_torchrun(steps: int, backend: str) -> int:
    """One torchrun rank; rank 0 prints the report."""
    try:
        report = run_rank(steps, backend=backend)
    except DemoError as e:
        print("[FAIL] " + str(e), file=sys.stderr)
        return 1
    if report is not None:
        _print_report(report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opaque_subclass.cli.demo [--steps N] [--world-size N] [--backend B]``,
    or under ``torchrun --nproc-per-node N``."""
    import argparse

    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m opaque_subclass.cli.demo",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Under torchrun (its RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set) every process runs one "
        "rank and the world size is torchrun's.",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=None, help="local processes to start (default: 2)")
    parser.add_argument("--backend", default="aot_eager")
    ns = parser.parse_args(args)
    torchrun = _launched_by_torchrun()
    world_size = int(os.environ["WORLD_SIZE"]) if torchrun else 2 if ns.world_size is None else ns.world_size
    if torchrun and ns.world_size not in (None, world_size):
        parser.error(f"--world-size {ns.world_size}, but torchrun started {world_size} ranks")
    try:
        _check_arguments("demo", ns.steps, world_size)
    except ValueError as e:
        parser.error(str(e))
    if torchrun:
        return _main_torchrun(ns.steps, ns.backend)
    try:
        report = run_demo(ns.steps, world_size, backend=ns.backend)
    except DemoError as e:
        print("[FAIL] " + str(e), file=sys.stderr)
        return 1
    _print_report(report)
    return 0


if __name__ == "__main__":
    code = main()
    if _launched_by_torchrun():
        # The report is printed and the process group destroyed. Skip interpreter
        # teardown, as the local workers do: background threads of gloo and
        # torch.compile can abort it after the work is done, and torchrun would
        # report the abort as this rank's failure.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
