"""The server of :class:`opaque_subclass.testing.WarmInterpreters`, run as a
script (``python _warm_server.py FD MODULE...``), never imported: importing it
as ``opaque_subclass.testing._warm_server`` would import the library, and every
process forked from the server would start with the library imported.

It imports the preload modules (torch, Dynamo, Inductor, ...) and calls the
preload functions (``module:function``: facts of the machine torch memoizes),
then serves
requests read as JSON lines from the socket ``FD``: each request forks a child
that becomes the interpreter the request describes (``-c CODE``, ``-m MODULE``
or ``SCRIPT``, with its arguments, environment, working directory and output
files) and exits as that interpreter would. The server answers each request
with the child's pid and, when the child exits, with its exit status (what
``subprocess.Popen.returncode`` would be: negative for a signal). Standard
library only, nothing else imported, no thread started: it forks.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import traceback
from typing import Any

#: The entries of ``sys.path`` that an interpreter gets without ``PYTHONPATH``
#: or a script directory: this server's, less its own directory and its
#: ``PYTHONPATH`` entries.
_SERVER_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
_BASE_PATH = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]


def _open_output(path: str | None, fd: int) -> None:
    target = os.open(path if path else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _exit_code(e: SystemExit) -> int:
    """The exit status of an interpreter ended by ``SystemExit(code)``."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _become(request: dict[str, Any]) -> int:
    """In the forked child: become the interpreter of ``request``; its exit status."""
    import atexit
    import runpy
    import threading
    import types

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _open_output(request["stdout"], 1)
    if request["stderr"] == "stdout":
        os.dup2(1, 2)
    else:
        _open_output(request["stderr"], 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    kind, target, args = request["kind"], request["target"], request["args"]
    first = "" if kind == "-c" else os.getcwd() if kind == "-m" else os.path.dirname(os.path.abspath(target))
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *_BASE_PATH]
    code = 0
    try:
        if kind == "-c":
            sys.argv = ["-c", *args]
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        elif kind == "-m":
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    # What an interpreter does when its main module ends: wait for its
    # non-daemon threads, run the atexit functions, flush.
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a stream closed by the child: its own business
            pass
    return code


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    buffer = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.02)
        if readable:
            data = sock.recv(1 << 20)
            if not data:  # the client has gone: so do we (the children run on)
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    try:
                        status = _become(request)
                    except BaseException:
                        traceback.print_exc()
                        status = 1
                    os._exit(status & 0xFF)  # as the OS keeps an exit status
                children.add(pid)
                _send(sock, {"pid": pid, "id": request["id"]})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(sock, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})


#: The preload entry of inductor's probe of the CPU's vector ISA (see :func:`_probe_vec_isa`).
_VEC_ISA_PROBE = "torch._inductor.cpu_vec_isa:valid_vec_isa_list"


def _probe_vec_isa(cpu_vec_isa: Any) -> None:
    """Inductor's probe of the CPU's vector ISA (``valid_vec_isa_list()``, memoized for the
    forks), with the child of each candidate's check started as torch 2.13 and newer start it.

    torch 2.11 and 2.12 check each candidate ISA by building a small library, then starting
    ``python -c "import torch; cdll.LoadLibrary(lib)"``: the import only makes torch's shared
    libraries loadable, and costs about 2.5 s a candidate on a 2-core machine (25 s a server).
    torch 2.13 starts that child without importing torch, with torch's ``lib`` directory first on
    ``LD_LIBRARY_PATH`` (Linux). Where the running torch's child imports torch (on Linux), this
    runs its probe that way: torch's own ``check_build``, with the child's script less the import
    and the variable set, both restored before the server forks anything. Anywhere else,
    torch's probe as it is. The answer is torch's: tests/test_warm.py compares a served
    process's list with the one the test process computes with torch's own probe.
    """
    isa = cpu_vec_isa.VecISA
    load = isa.__dict__.get("_avx_py_load")
    if sys.platform != "linux" or not isinstance(load, str) or "import torch\n" not in load:
        cpu_vec_isa.valid_vec_isa_list()
        return
    import torch

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    saved = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([lib, saved]) if saved else lib
    isa._avx_py_load = load.replace("import torch\n", "", 1)
    try:
        cpu_vec_isa.valid_vec_isa_list()
    finally:
        isa._avx_py_load = load
        if saved is None:
            del os.environ["LD_LIBRARY_PATH"]
        else:
            os.environ["LD_LIBRARY_PATH"] = saved


def main() -> None:
    fd, *modules = sys.argv[1:]
    import importlib

    for entry in modules:  # "module", or "module:function" to call once imported
        name, _, call = entry.partition(":")
        module = importlib.import_module(name)
        if entry == _VEC_ISA_PROBE:
            _probe_vec_isa(module)
        elif call:
            getattr(module, call)()
    sys.stdout.flush()
    serve(int(fd))


if __name__ == "__main__":
    main()
