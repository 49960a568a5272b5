"""Warm interpreters: Python processes started by forking a server that has
already imported torch, Dynamo and Inductor.

A fresh interpreter spends about 5 s of CPU importing ``torch``,
``torch._dynamo`` and ``torch._inductor`` (torch 2.15, this project's 2-core CI
machine), paid per rank, cache reader or docs page. :class:`WarmInterpreters`
pays it once per server: each process is forked from a server that only
imported those modules (no compilation, process group or this library), then
becomes the interpreter asked for (``python -c CODE``, ``-m MODULE`` or
``SCRIPT``, with its arguments, environment, working directory and output files)::

    from opaque_subclass.testing import WarmInterpreters, run_local_workers

    with WarmInterpreters():  # run_local_workers and simulate_job fork their ranks
        run_local_workers("my_module:train", world_size=4)

A served process differs from a fresh one only in the preloaded
``sys.modules`` and what the preload's functions memoized (see
:data:`DEFAULT_PRELOAD`). What torch read at import must match: an environment differing
beyond :data:`PER_PROCESS_ENV` gets a server of its own (see
:class:`WarmInterpreters` for the limit).
"""

from __future__ import annotations

import contextvars
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["DEFAULT_PRELOAD", "PER_PROCESS_ENV", "WarmInterpreters", "WarmProcess"]

#: What a server imports before it forks: what a process that compiles imports first. An entry
#: ``module:function`` also calls the function once: inductor's probe of the CPU's vector ISA (a
#: g++ build and a ``dlopen`` in a child per candidate, paid again by every process whose
#: ``TORCHINDUCTOR_CACHE_DIR`` is new) and its pattern tables, each memoized by torch and the
#: same in every process of one environment. The server runs the ISA probe as torch 2.13 does on
#: 2.11 and 2.12 as well (see ``_warm_server._probe_vec_isa``): about 25 s less per server there.
DEFAULT_PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch.distributed",
    "torch._inductor.cpu_vec_isa:valid_vec_isa_list",
    "torch._inductor.fx_passes.joint_graph:lazy_init",
    "torch._inductor.fx_passes.post_grad:lazy_init",
)

#: Variables a served process may set differently from its server: read by torch on use,
#: not import (the cache directory), or by Python at start (rebuilt by the served process).
PER_PROCESS_ENV = frozenset({"TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH", "PYTEST_CURRENT_TEST"})

_SERVER_SCRIPT = Path(__file__).with_name("_warm_server.py")
#: The servers' inductor cache directory, in a WarmInterpreters' working directory.
_SERVERS_CACHE = "servers-cache"
#: How long a request waits for its process: the first waits for the server's imports.
_START_TIMEOUT_S = 300.0
_CURRENT: contextvars.ContextVar[WarmInterpreters | None] = contextvars.ContextVar(
    "opaque_subclass_warm_interpreters", default=None
)


def current() -> WarmInterpreters | None:
    """The :class:`WarmInterpreters` entered in this context, if any."""
    return _CURRENT.get()


def _command(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, target, args)`` of ``[sys.executable, -c CODE | -m MODULE | SCRIPT, *args]``, else ``None``."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return None
    if argv[1] in ("-c", "-m"):
        return (argv[1], argv[2], list(argv[3:])) if len(argv) > 2 else None
    if argv[1].startswith("-"):
        return None
    return "script", argv[1], list(argv[2:])


class _Server:
    """One server process, and the client end of its socket."""

    def __init__(self, env: Mapping[str, str], preload: Sequence[str], workdir: str) -> None:
        ours, theirs = socket.socketpair()
        self.log = Path(workdir, f"server{id(self)}.log")
        server_env = dict(env)
        # what torch writes while the preload runs goes here, never to a served process's cache; the
        # servers of one WarmInterpreters share it, so the vector-ISA probe's C++ builds are made once
        # (a later server only loads them: 0.6 s instead of 4 s on a 2-core x86 machine, torch 2.13)
        server_env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(workdir, _SERVERS_CACHE))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(_SERVER_SCRIPT), str(theirs.fileno()), *preload],
                pass_fds=[theirs.fileno()],
                env=server_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self.running: set[int] = set()  # started, exit not yet reported
        self.last_used = time.monotonic()
        self.buffer = b""
        self.next_id = 0

    def _receive(self, timeout: float) -> None:
        """Read what the server sent within ``timeout`` seconds (0: what is there)."""
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if not readable:
            return
        data = self.sock.recv(1 << 16)
        if not data:
            tail = _read(self.log)[-3000:]
            raise RuntimeError(f"WarmInterpreters: the server (pid {self.proc.pid}) has exited; its output:\n{tail}")
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            message = json.loads(line)
            if "exit" in message:
                self.exits[message["exit"]] = message["status"]
                self.running.discard(message["exit"])
            else:
                self.pids[message["id"]] = message["pid"]
                self.running.add(message["pid"])

    def start(self, request: dict[str, Any]) -> int:
        with self.lock:
            self.next_id += 1
            request_id = request["id"] = self.next_id
            self.sock.sendall(json.dumps(request).encode() + b"\n")
            deadline = time.monotonic() + _START_TIMEOUT_S
            while request_id not in self.pids:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"WarmInterpreters: the server (pid {self.proc.pid}) started no process within "
                        f"{_START_TIMEOUT_S:.0f} s; its output:\n{_read(self.log)[-3000:]}"
                    )
                self._receive(1.0)
            self.last_used = time.monotonic()
            return self.pids.pop(request_id)

    def idle(self) -> bool:
        """Whether every process this server started has exited (and been reported)."""
        with self.lock:
            self._receive(0)
            return not self.running

    def status(self, pid: int) -> int | None:
        with self.lock:
            self._receive(0)
            return self.exits.get(pid)

    def close(self) -> None:
        self.sock.close()  # the server ends when its socket does
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WarmProcess:
    """A served process (its parent the server, which reports its exit), with the
    :class:`subprocess.Popen` parts a launcher uses (``pid``, ``poll``, ``wait``, ...)."""

    def __init__(self, server: _Server, pid: int, args: Sequence[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not yet reaped by the server: the pid is still this process's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class WarmInterpreters:
    """Start Python processes forked from servers that imported ``preload``.

    A context manager: inside it, :func:`~opaque_subclass.testing.run_local_workers`
    and :func:`~opaque_subclass.testing.simulate_job` start their ranks with it;
    on exit its servers end (their processes run on). A server starts (seconds)
    at the first request of each environment (less :data:`PER_PROCESS_ENV`), at
    most ``max_servers``: beyond, the idle one used longest ago ends, or, with
    none idle, the process starts the ordinary way. Thread-safe.
    """

    def __init__(self, preload: Sequence[str] = DEFAULT_PRELOAD, *, max_servers: int = 2) -> None:
        self.preload = tuple(preload)
        self.max_servers = max_servers
        self._servers: dict[tuple[tuple[str, str], ...], _Server] = {}
        self._lock = threading.Lock()
        self._workdir = tempfile.TemporaryDirectory(prefix="opaque_subclass_warm_")
        self._tokens: list[contextvars.Token[WarmInterpreters | None]] = []

    def _server(self, env: Mapping[str, str]) -> _Server | None:
        key = tuple(sorted((k, v) for k, v in env.items() if k not in PER_PROCESS_ENV))
        with self._lock:
            server = self._servers.get(key)
            if server is None and len(self._servers) >= self.max_servers:
                # make room: end the server used longest ago that has nothing running (a server's
                # processes report their exit through it, so a busy one stays)
                idle = [k for k, s in self._servers.items() if s.idle()]
                if idle:
                    self._servers.pop(min(idle, key=lambda k: self._servers[k].last_used)).close()
            if server is None and len(self._servers) < self.max_servers:
                server = self._servers[key] = _Server(env, self.preload, self._workdir.name)
            return server

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: str | os.PathLike[str] | None = None,
        stderr: str | os.PathLike[str] | None = "stdout",
    ) -> WarmProcess | None:
        """Start ``argv`` (``[sys.executable, "-c" | "-m" | SCRIPT, ...]``), input
        empty, output appended to the file ``stdout``, errors to ``stderr`` (or
        ``"stdout"``; ``None`` discards). ``None`` when it cannot be served."""
        command = _command(argv)
        if command is None:
            return None
        environment = dict(os.environ if env is None else env)
        server = self._server(environment)
        if server is None:
            return None
        kind, target, args = command
        request = {
            "kind": kind,
            "target": target,
            "args": args,
            "env": environment,
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "stdout": os.fspath(stdout) if stdout is not None else None,
            "stderr": stderr if stderr in (None, "stdout") else os.fspath(stderr),
        }
        return WarmProcess(server, server.start(request), argv)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(argv, capture_output=True, text=True, ...)``, served when
        it can be; on a timeout, kills it and raises :class:`subprocess.TimeoutExpired`."""
        with tempfile.TemporaryDirectory(prefix="opaque_subclass_warm_run_") as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            proc = self.popen(argv, env=env, cwd=cwd, stdout=out, stderr=err)
            if proc is None:
                return _run_ordinary(argv, env=env, cwd=cwd, timeout=timeout)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                raise subprocess.TimeoutExpired(
                    list(argv), timeout or 0.0, output=_read(out), stderr=_read(err)
                ) from None
            return subprocess.CompletedProcess(list(argv), code, _read(out), _read(err))

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()
        self._workdir.cleanup()

    def __enter__(self) -> WarmInterpreters:
        self._tokens.append(_CURRENT.set(self))
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        _CURRENT.reset(self._tokens.pop())
        self.close()


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def popen_or_none(argv: Sequence[str], *, env: Mapping[str, str], stdout: str | os.PathLike[str]) -> WarmProcess | None:
    """A served process for a launcher inside :class:`WarmInterpreters`, output
    and errors to ``stdout``; ``None`` outside it or when it cannot serve."""
    warm = current()
    return None if warm is None else warm.popen(argv, env=env, stdout=stdout, stderr="stdout")


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)``: served inside
    :class:`WarmInterpreters`, the ordinary way outside it."""
    warm = current()
    if warm is None:
        return _run_ordinary(argv, env=env, cwd=cwd, timeout=timeout)
    return warm.run(argv, env=env, cwd=cwd, timeout=timeout)


def _run_ordinary(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    timeout: float | None,
) -> subprocess.CompletedProcess[str]:
    """``argv`` in a new interpreter, its output captured as text."""
    return subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
