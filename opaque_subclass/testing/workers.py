"""The one multi-process launcher: run a function in every rank of a local gloo
group on 127.0.0.1, every wait bounded, so that a failure never hangs.

Used by the demo (:mod:`opaque_subclass.cli.demo`), the examples and the tests::

    from opaque_subclass.testing import run_local_workers

    def train(rank, world_size, payload):  # in an importable module or a file
        ...
        return {"loss": 0.5}

    results = run_local_workers("my_module:train", world_size=2, timeout=100)

A rank runs ``python -m opaque_subclass.testing._worker_main TARGET RANK WORLD
PORT WORKDIR PG_TIMEOUT`` (its own module: run with ``-m``, this module, which
``opaque_subclass.testing`` imports, would run twice and make runpy warn); the
parent reads each rank's JSON result from ``WORKDIR``.

The rendezvous ``TCPStore`` is the parent's, bound to a kernel-picked port
(port 0) and served until every rank has exited. A port chosen first and bound
later by rank 0 can be taken in between, and a store served by rank 0 vanishes
when it exits while a peer may still connect: either left a rank retrying until
the deadline (seen once in CI, torch 2.15: rank 0 exited 0, rank 1 still in
``TCPStore``'s constructor after 60 s).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from opaque_subclass.testing import warm

__all__ = ["WorkersFailed", "run_local_workers"]

log = logging.getLogger(__name__)


class WorkersFailed(RuntimeError):
    """A rank of :func:`run_local_workers` raised, died, or the run took too long;
    the message holds the failing rank's traceback or output."""


def _load_target(target: str) -> Callable[..., Any]:
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"worker target {target!r} must be 'package.module:function' or '/path/file.py:function'")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load worker file {where!r}")
        module = importlib.util.module_from_spec(spec)
        # registered as an import would be, so classes the file defines pickle by name (a compile
        # cache keys a subclass by its class's importable path; unregistered, torch bypasses it)
        sys.modules.setdefault(spec.name, module)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    function: Callable[..., Any] = getattr(module, name)  # the target names a function
    return function


#: The module each rank runs with ``python -m``.
_ENTRY_MODULE = "opaque_subclass.testing._worker_main"


def _run_rank(target: str, rank: int, world_size: int, port: int, workdir: str, pg_timeout: float) -> int:
    """One rank: join the group, run the target, write the result, leave the group.

    A failure's report carries ``failed_at`` (:func:`time.monotonic`, the launcher's clock) when the
    exception reached this function: for the target's exception, before the rank leaves the group,
    so before any peer can lose its connection to it.
    """
    result: dict[str, Any] = {"rank": rank}
    failed_at: float | None = None
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import TCPStore  # torch.distributed re-exports it, untyped

        fn = _load_target(target)
        payload = json.loads(Path(workdir, "payload.json").read_text())
        timeout = timedelta(seconds=pg_timeout)
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        try:
            result["value"] = fn(rank, world_size, payload)
        except BaseException:
            failed_at = time.monotonic()
            raise
        finally:
            dist.destroy_process_group()
        result["ok"] = True
    except BaseException:
        result["ok"] = False
        result["failed_at"] = time.monotonic() if failed_at is None else failed_at
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
        ``"package.module:function"`` or ``"/path/to/file.py:function"``, run after
        ``torch.distributed.init_process_group("gloo")`` on 127.0.0.1; returns something JSON-serializable.
    world_size
        Number of processes (ranks).
    payload
        JSON-serializable arguments passed to every rank.
    timeout
        Seconds for the whole run. Collectives time out earlier, so a rank waiting for a dead
        peer fails instead of hanging.

    Returns
    -------
    list
        The return values, by rank.

    Raises
    ------
    WorkersFailed
        If a rank raised, died, or the run took longer than ``timeout``; the message holds the
        failing rank's traceback or output.
    """
    if world_size < 1:
        raise ValueError(f"run_local_workers: world_size must be at least 1, got {world_size}")
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    deadline = started + timeout
    with tempfile.TemporaryDirectory(prefix="opaque_subclass_workers_") as workdir:
        Path(workdir, "payload.json").write_text(json.dumps(dict(payload or {})))
        pg_timeout = max(5.0, timeout * 0.6)
        store = _parent_store(pg_timeout)
        port = int(store.port)
        log.debug("starting %d workers for %s on 127.0.0.1:%d in %s", world_size, target, port, workdir)
        procs: list[_Process] = []
        logs: list[Path] = []
        try:
            for rank in range(world_size):
                log_path = Path(workdir, f"log{rank}.txt")
                logs.append(log_path)
                argv = [sys.executable, "-m", _ENTRY_MODULE, target, str(rank), str(world_size), str(port)]
                argv += [workdir, str(pg_timeout)]
                procs.append(_start(argv, env, log_path))
            ran_until, exited_at = _watch(
                procs,
                started,
                deadline,
                on_timeout=lambda: WorkersFailed(
                    f"{target}: {world_size} workers did not finish within {timeout:.0f} s" + _logs_text(procs, logs)
                ),
            )
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
            for rank, (report, proc) in enumerate(zip(reports, procs, strict=True))
            if report is None or not report["ok"] or proc.returncode != 0
        ]
        if failed:
            # The rank that failed first is the cause; its peers often only lost
            # their connection to it, and may exit before it does.
            order = _signal_first(
                sorted(failed, key=lambda r: (_failed_when(reports[r], ran_until.get(r)), r)), reports, procs, ran_until
            )
            first = order[0]

            def how(r: int, brief: bool) -> str:
                report = reports[r]
                if r not in exited_at and (report is None or report["ok"]):
                    return "was still running and was stopped by the launcher"
                return _how_it_ended(procs[r], report, brief=brief)

            others = "".join(f"\nthen rank {r} {how(r, True)}" for r in order[1:])
            raise WorkersFailed(
                f"{target}: rank {first} {how(first, False)}{others}\noutput of rank {first}:\n{_tail(logs[first])}"
            )
        results = [report["value"] for report in reports if report is not None]
        return results


class _Process(Protocol):
    """What the launcher uses of a rank's process: a :class:`subprocess.Popen`, or a
    :class:`~opaque_subclass.testing.warm.WarmProcess` inside ``WarmInterpreters``."""

    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def _start(argv: list[str], env: dict[str, str], log_path: Path) -> _Process:
    """A rank's process, output and errors to ``log_path``: forked by the
    ``WarmInterpreters`` entered around the launcher, else a new interpreter."""
    served = warm.popen_or_none(argv, env=env, stdout=log_path)
    if served is not None:
        return served
    with open(log_path, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def _parent_store(pg_timeout: float) -> Any:
    """The run's rendezvous store, served by the launcher on 127.0.0.1 at a port
    the kernel picks; it does not wait for the ranks to connect."""
    from torch._C._distributed_c10d import TCPStore  # torch.distributed re-exports it, untyped

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=pg_timeout))


#: After the first rank fails, how long its peers get to write their own
#: reports before the launcher stops them.
_GRACE_S = 1.0
_POLL_S = 0.02


def _watch(
    procs: Sequence[_Process],
    started: float,
    deadline: float,
    *,
    on_timeout: Callable[[], Exception],
) -> tuple[dict[int, float], dict[int, float]]:
    """Poll every rank until all exited, or one failed and the grace period passed. Returns, per
    exited rank, the last poll seeing it running (``started``, read before the first rank started,
    if none) and the poll seeing it exited. A death is seen within one poll interval."""
    ran_until: dict[int, float] = {}
    exited_at: dict[int, float] = {}
    previous = started
    while True:
        now = time.monotonic()
        for rank, p in enumerate(procs):
            if rank not in exited_at and p.poll() is not None:
                ran_until[rank] = previous
                exited_at[rank] = now
        if len(exited_at) == len(procs):
            return ran_until, exited_at
        failures = [exited_at[r] for r in exited_at if procs[r].returncode != 0]
        if failures and now - min(failures) > _GRACE_S:
            return ran_until, exited_at
        if now > deadline:
            raise on_timeout()
        previous = now
        time.sleep(_POLL_S)


def _failed_when(report: Mapping[str, Any] | None, ran_until: float | None) -> float:
    """When a failed rank failed (:func:`time.monotonic`): a rank that raised, when its exception
    reached the worker (before peers could lose it); another exited rank, the last poll seeing it
    running (the earliest it can have ended); a rank the launcher stopped, after all of those."""
    if report is not None and not report["ok"]:
        return float(report["failed_at"])
    return float("inf") if ran_until is None else ran_until


def _signal_first(
    order: list[int],
    reports: Sequence[Mapping[str, Any] | None],
    procs: Sequence[_Process],
    ran_until: Mapping[int, float],
) -> list[int]:
    """``order`` with a rank that a signal killed on its own put before a rank
    that raised up to :data:`_GRACE_S` earlier: a killed process closes its
    connections while the kernel tears it down, before ``poll()`` sees it
    exit, so its peer's "connection closed" can carry the earlier time."""
    first = order[0]
    report = reports[first]
    if report is None or report["ok"]:
        return order
    raised_at = float(report["failed_at"])
    for r in order[1:]:
        code = procs[r].returncode
        killed = code is not None and code < 0 and (reports[r] is None or reports[r]["ok"])  # type: ignore[index]
        if killed and r in ran_until and ran_until[r] - raised_at < _GRACE_S:
            return [r, *(x for x in order if x != r)]
    return order


def _how_it_ended(proc: _Process, report: Mapping[str, Any] | None, *, brief: bool) -> str:
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


def _logs_text(procs: Sequence[_Process], logs: Sequence[Path]) -> str:
    parts = [
        f"\n--- rank {i} (exit code {p.poll()}):\n{_tail(path)}"
        for i, (p, path) in enumerate(zip(procs, logs, strict=True))
    ]
    return "".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """One rank: ``python -m opaque_subclass.testing._worker_main TARGET RANK WORLD PORT WORKDIR PG_TIMEOUT``."""
    target, rank, world_size, port, workdir, pg_timeout = list(sys.argv[1:] if argv is None else argv)[:6]
    code = _run_rank(target, int(rank), int(world_size), int(port), workdir, float(pg_timeout))
    # The result is on disk and the process group destroyed. Skip interpreter
    # teardown: background threads of gloo and torch.compile can abort it
    # ("terminate called without an active exception") after the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
