"""The demo of ``python -m opaque_subclass``: tensor-parallel training with
:class:`~opaque_subclass.sharded.ShardedTensor` under torch.compile, in local
processes joined by a gloo process group on 127.0.0.1.

Each rank trains a small MLP (16 -> 32 -> 32 -> 8) whose weights are sharded
tensors: the first layer column-parallel, the second row-parallel (a collective
in forward and one in backward), the third column-parallel again, its output
compared with a replicated target. Each step is forward, loss and backward
through ``torch.compile``, then an eager SGD update. The losses are compared
with an unsharded eager reference trained on the same data from the same
weights. Then the trained weights move to a second mesh built on a *new* process
group and training goes on with the same compiled function. It must not
recompile, it must still match, and the collectives must run on the new group
(recorded by :func:`~opaque_subclass.sharded.record_collectives` as they run).

:func:`run_local_workers` is the launcher underneath: a function run by every
rank of a local gloo group, with every wait bounded, so that a failure never
hangs.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "MLP_PLAN",
    "DemoError",
    "DemoReport",
    "run_demo",
    "run_local_workers",
    "shard_module",
    "train_worker",
]

log = logging.getLogger(__name__)

#: Shard dim of each parameter of the demo MLP (``None``: replicated).
MLP_PLAN: dict[str, int | None] = {
    "0.weight": 0, "0.bias": 0,  # column-parallel: output features split
    "2.weight": 1, "2.bias": None,  # row-parallel: contraction over the split, all-reduce
    "4.weight": 0, "4.bias": 0,  # column-parallel again: the output stays split
}


class DemoError(RuntimeError):
    """The demo (or a worker of :func:`run_local_workers`) failed; the message says how."""

    def __init__(self, message: str, report: DemoReport | None = None) -> None:
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------- launcher


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load_target(target: str) -> Callable[..., Any]:
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"worker target {target!r} must be 'package.module:function' or '/path/file.py:function'")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load worker file {where!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)  # type: ignore[no-any-return]


def _worker_main(target: str, rank: int, world_size: int, port: int, workdir: str, pg_timeout: float) -> int:
    """One rank: join the group, run the target, write the result, leave the group."""
    result: dict[str, Any] = {"rank": rank}
    try:
        import torch.distributed as dist

        fn = _load_target(target)
        payload = json.loads(Path(workdir, "payload.json").read_text())
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout),
        )
        try:
            result["value"] = fn(rank, world_size, payload)
        finally:
            dist.destroy_process_group()
        result["ok"] = True
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        result["ok"] = False
        result["error"] = traceback.format_exc()
    path = Path(workdir, f"result{rank}.json")
    path.with_suffix(".tmp").write_text(json.dumps(result))
    path.with_suffix(".tmp").replace(path)
    return 0 if result["ok"] else 1


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def run_local_workers(
    target: str, world_size: int = 2, *, payload: Mapping[str, Any] | None = None, timeout: float = 100.0
) -> list[Any]:
    """Run ``fn(rank, world_size, payload)`` in ``world_size`` local processes.

    Parameters
    ----------
    target
        ``"package.module:function"`` or ``"/path/to/file.py:function"``. The
        function runs after ``torch.distributed.init_process_group("gloo")`` on
        127.0.0.1 and must return something JSON-serializable.
    world_size
        Number of processes (ranks).
    payload
        JSON-serializable arguments passed to every rank.
    timeout
        Seconds for the whole run. Collectives time out earlier, so a rank
        waiting for a dead peer fails instead of hanging.

    Returns
    -------
    list
        The return values, by rank.

    Raises
    ------
    DemoError
        If a rank raised, died, or the run took longer than ``timeout``; the
        message holds the failing rank's traceback or output.
    """
    if world_size < 1:
        raise ValueError(f"run_local_workers: world_size must be at least 1, got {world_size}")
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="opaque_subclass_workers_") as workdir:
        Path(workdir, "payload.json").write_text(json.dumps(dict(payload or {})))
        port = _free_port()
        pg_timeout = max(5.0, timeout * 0.6)
        log.debug("starting %d workers for %s on 127.0.0.1:%d in %s", world_size, target, port, workdir)
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[Path] = []
        try:
            for rank in range(world_size):
                log_path = Path(workdir, f"log{rank}.txt")
                logs.append(log_path)
                with open(log_path, "wb") as out:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "opaque_subclass.demo", "--worker", target, str(rank),
                             str(world_size), str(port), workdir, str(pg_timeout)],
                            stdout=out, stderr=subprocess.STDOUT, env=env,
                        )
                    )
            exited_at = _watch(procs, deadline, on_timeout=lambda: DemoError(
                f"{target}: {world_size} workers did not finish within {timeout:.0f} s" + _logs_text(procs, logs)
            ))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
        reports: list[dict[str, Any] | None] = []
        for rank in range(world_size):
            path = Path(workdir, f"result{rank}.json")
            reports.append(json.loads(path.read_text()) if path.exists() else None)
        failed = [
            rank
            for rank, (report, proc) in enumerate(zip(reports, procs))
            if report is None or not report["ok"] or proc.returncode != 0
        ]
        if failed:
            # The first rank seen to exit is the cause; its peers often only lost
            # their connection to it. Ranks still running when the launcher
            # stopped them come last.
            order = sorted(failed, key=lambda r: (exited_at.get(r, float("inf")), reports[r] is not None, r))
            first = order[0]

            def how(r: int, brief: bool) -> str:
                if r not in exited_at:
                    return "was still running and was stopped by the launcher"
                return _how_it_ended(procs[r], reports[r], brief=brief)

            others = "".join(f"\nthen rank {r} {how(r, True)}" for r in order[1:])
            raise DemoError(
                f"{target}: rank {first} {how(first, False)}"
                f"{others}\noutput of rank {first}:\n{_tail(logs[first])}"
            )
        results = [report["value"] for report in reports if report is not None]
        return results


#: After the first rank fails, how long its peers get to write their own
#: reports before the launcher stops them.
_GRACE_S = 1.0
_POLL_S = 0.02


def _watch(
    procs: Sequence[subprocess.Popen[bytes]], deadline: float, *, on_timeout: Callable[[], Exception]
) -> dict[int, float]:
    """Poll every rank until all have exited, or one failed and the grace period
    passed; returns when each rank was first seen to have exited. A death is seen
    within one poll interval, whichever rank it is."""
    exited_at: dict[int, float] = {}
    while True:
        now = time.monotonic()
        for rank, p in enumerate(procs):
            if rank not in exited_at and p.poll() is not None:
                exited_at[rank] = now
        if len(exited_at) == len(procs):
            return exited_at
        failures = [exited_at[r] for r in exited_at if procs[r].returncode != 0]
        if failures and now - min(failures) > _GRACE_S:
            return exited_at
        if now > deadline:
            raise on_timeout()
        time.sleep(_POLL_S)


def _how_it_ended(proc: subprocess.Popen[bytes], report: Mapping[str, Any] | None, *, brief: bool) -> str:
    code = proc.returncode
    if report is not None and not report["ok"]:
        error = str(report["error"])
        return "failed: " + error.strip().splitlines()[-1] if brief else "failed:\n" + error
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}" + ("" if report is None else " after finishing its work")
    if report is None:
        return f"exited with code {code} without a result"
    return f"exited with code {code} after finishing its work"


def _logs_text(procs: Sequence[subprocess.Popen[bytes]], logs: Sequence[Path]) -> str:
    parts = [f"\n--- rank {i} (exit code {p.poll()}):\n{_tail(path)}" for i, (p, path) in enumerate(zip(procs, logs))]
    return "".join(parts)


# ---------------------------------------------------------------- the demo


def _mlp() -> nn.Sequential:
    import torch.nn as nn

    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))


def shard_module(module: nn.Module, mesh: DeviceMesh, plan: Mapping[str, int | None]) -> nn.Module:
    """Replace the parameters named in ``plan`` by ``nn.Parameter(ShardedTensor)``, in place.

    Each value is the shard dim (``None``: replicated) of that parameter, whose
    current value (a plain tensor, or a ShardedTensor on another mesh) is the
    same on every rank. Returns ``module``.
    """
    import torch.nn as nn

    from .sharded import ShardedTensor

    names = dict(module.named_parameters())
    missing = sorted(set(plan) - set(names))
    if missing:
        raise ValueError(f"shard_module: the plan names {missing}, which are not parameters of {type(module).__qualname__}")
    for name, dim in plan.items():
        value = names[name].detach()
        full = value.full_tensor() if isinstance(value, ShardedTensor) else value
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        setattr(owner, attr, nn.Parameter(ShardedTensor.from_full(full, mesh, dim)))
    return module


def _loss(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((model(x) - target) ** 2).mean()


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
                p.sub_(p.grad, alpha=lr)
                p.grad = None
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()))
    return losses, times


def train_worker(rank: int, world_size: int, payload: Mapping[str, Any]) -> dict[str, Any]:
    """One rank of the demo (see the module docstring); runs inside :func:`run_local_workers`."""
    import torch
    import torch._dynamo
    import torch._dynamo.testing
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    import opaque_subclass

    from .sharded import record_collectives

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

    group_b = dist.new_group(list(range(world_size)))
    mesh_b = DeviceMesh.from_group(group_b, "cpu")
    model = shard_module(model, mesh_b, MLP_PLAN)  # the trained weights, now on mesh B
    with record_collectives() as seen_b:
        losses_b, times_b = _train(model, compiled, data[steps:], lr)
    frames_b = counter.frame_count - frames_a

    ref_params = dict(reference.named_parameters())
    weight_error = max(
        float((p.detach().full_tensor() - ref_params[n].detach()).abs().max()) for n, p in model.named_parameters()
    )
    compiled_losses = losses_a + losses_b
    return {
        "torch_version": torch.__version__,
        "mode": opaque_subclass.support().mode,
        "frames_a": frames_a,
        "frames_b": frames_b,
        "loss_error": max(abs(a - b) for a, b in zip(compiled_losses, ref_losses)),
        "eager_loss_error": max(abs(a - b) for a, b in zip(eager_losses, ref_losses)),
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


def run_demo(
    steps: int = 5,
    world_size: int = 2,
    *,
    backend: str = "aot_eager",
    lr: float = 0.1,
    seed: int = 0,
    tolerance: float = 1e-5,
    timeout: float = 100.0,
) -> DemoReport:
    """Run the sharded-MLP demo in ``world_size`` local processes; see the module docstring.

    Parameters
    ----------
    steps
        Training steps on each of the two meshes.
    world_size
        Number of processes; 32 and 8 (the layer widths) must divide by it.
    backend
        The torch.compile backend, ``"aot_eager"`` (fast to compile) or
        ``"inductor"``.
    lr, seed
        SGD learning rate and the seed of the weights and data.
    tolerance
        Largest accepted absolute difference from the unsharded reference.
    timeout
        Seconds for the whole run.

    Returns
    -------
    DemoReport

    Raises
    ------
    DemoError
        If a rank failed or timed out, or the report breaks a requirement (its
        ``report`` attribute then holds the report).
    """
    if steps < 2:
        raise ValueError(f"run_demo: steps must be at least 2 (the first compiled step is not timed), got {steps}")
    if 8 % world_size:
        raise ValueError(f"run_demo: world_size {world_size} does not divide the layer widths 32 and 8; use 1, 2, 4 or 8")
    t0 = time.perf_counter()
    payload = {"steps": steps, "backend": backend, "lr": lr, "seed": seed}
    results = run_local_workers("opaque_subclass.demo:train_worker", world_size, payload=payload, timeout=timeout)
    first = results[0]
    report = DemoReport(
        torch_version=first["torch_version"],
        mode=first["mode"],
        world_size=world_size,
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
        seconds=time.perf_counter() - t0,
    )
    problems = report.failures(tolerance)
    wrong_group = [i for i, r in enumerate(results) if r["groups_b"] != [r["group_b"]]]
    if wrong_group:
        problems.append(f"rank(s) {wrong_group}: collectives on mesh B did not all run on mesh B's process group")
    if any(r["losses"] != first["losses"] for r in results[1:]):
        problems.append("the ranks saw different losses; a replicated value diverged between ranks")
    if problems:
        raise DemoError("demo failed: " + "; ".join(problems) + "\n" + "\n".join(report.lines()), report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opaque_subclass.demo [--steps N] [--world-size N] [--backend B]``."""
    import argparse

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--worker"]:
        target, rank, world_size, port, workdir, pg_timeout = args[1:7]
        code = _worker_main(target, int(rank), int(world_size), int(port), workdir, float(pg_timeout))
        # The result is on disk and the process group destroyed. Skip interpreter
        # teardown: background threads of gloo and torch.compile can abort it
        # ("terminate called without an active exception") after the work is done.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    parser = argparse.ArgumentParser(prog="python -m opaque_subclass.demo", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", default="aot_eager")
    ns = parser.parse_args(args)
    try:
        report = run_demo(ns.steps, ns.world_size, backend=ns.backend)
    except DemoError as e:
        print(e, file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
