"""opaque_subclass.testing.WarmInterpreters: a served process is the
interpreter its command line asks for (arguments, path, environment, working
directory, output, exit status, signals), started without importing torch
again, and never with the library or the server's cache directory; what it
cannot serve (another environment past ``max_servers``, interpreter options)
starts the ordinary way; the launcher uses it only where it is entered."""

from __future__ import annotations

import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from opaque_subclass.testing import WarmInterpreters, run_local_workers, warm

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "path1": sys.path[1], "cwd": os.getcwd(),
    "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "mark": os.environ.get("WARM_MARK"), "parent": os.getppid(),
    "torch_loaded": "torch" in sys.modules, "library_loaded": "opaque_subclass" in sys.modules,
    "main": __name__, "stdin": sys.stdin.read(),
}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


# one worker runs the module, in order, with one server (max_servers=1) for the environment of _env()
pytestmark = pytest.mark.xdist_group("warm")


@pytest.fixture(scope="module")
def interpreters():
    with WarmInterpreters(max_servers=1) as w:
        yield w


def _env(**extra: str) -> dict[str, str]:
    """This process's environment, for the module's one server (``WARM_MARK`` is part of it)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "WARM_MARK": "one", **extra}


def test_a_served_process_is_the_interpreter_asked_for(interpreters, tmp_path):
    env = _env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    t0 = time.monotonic()
    first = interpreters.run([sys.executable, "-c", PROBE, "3"], env=env, cwd=tmp_path, timeout=120)
    started = time.monotonic() - t0
    second = interpreters.run([sys.executable, "-c", PROBE, "0"], env=env, cwd=tmp_path, timeout=120)
    assert first.returncode == 3 and second.returncode == 0, (first, second)
    got = json.loads(second.stdout)
    assert got["argv"] == ["-c", "0"] and got["main"] == "__main__" and got["stdin"] == ""
    assert got["path0"] == "" and got["path1"] == str(ROOT)  # as python -c with PYTHONPATH puts them
    assert got["cwd"] == str(tmp_path) and got["cache"] == str(tmp_path / "cache") and got["mark"] == "one"
    assert got["parent"] != os.getpid()  # forked by the server
    assert got["torch_loaded"] is True and got["library_loaded"] is False  # preloaded torch, never the library
    assert second.stderr == "to stderr\n"
    assert started < 120


def test_inductors_machine_probe_is_served_with_the_answer_this_process_computes(interpreters, tmp_path):
    """The preload's functions ran in the server: a served process with a new inductor cache directory
    has the CPU's vector ISA memoized (no g++ build there) and it is the one this process found itself."""
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    code = (
        "import json, os; from torch._inductor import cpu_vec_isa as c; memo = c.valid_vec_isa_list.cache_info().currsize; "
        "isa = [str(i) for i in c.valid_vec_isa_list()]; "
        "print(json.dumps({'memo': memo, 'isa': isa, 'files': os.listdir(os.environ['TORCHINDUCTOR_CACHE_DIR'])}))"
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    ran = interpreters.run([sys.executable, "-c", code], env=_env(TORCHINDUCTOR_CACHE_DIR=str(cache)), timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout)
    assert got == {"memo": 1, "isa": [str(i) for i in valid_vec_isa_list()], "files": []}, got


def test_a_module_and_a_script_run_as_main(interpreters, tmp_path):
    script = tmp_path / "probe_script.py"
    script.write_text(PROBE)
    env = _env()
    ran = interpreters.run([sys.executable, str(script), "0"], env=env, cwd=ROOT, timeout=120)
    got = json.loads(ran.stdout)
    assert (
        got["parent"] != os.getpid()
        and got["path0"] == str(tmp_path)
        and got["argv"] == [str(script), "0"]
        and got["main"] == "__main__"
    )
    ran = interpreters.run([sys.executable, "-m", "opaque_subclass", "--help"], env=env, timeout=120)
    cold = subprocess.run(
        [sys.executable, "-m", "opaque_subclass", "--help"], env=env, capture_output=True, text=True, timeout=120
    )
    assert (ran.returncode, ran.stdout) == (cold.returncode, cold.stdout) and cold.returncode == 0


def test_exit_status_signals_timeouts_and_exceptions(interpreters, tmp_path):
    env = _env()
    raised = interpreters.run([sys.executable, "-c", "raise KeyError('boom')"], env=env, timeout=60)
    assert raised.returncode == 1 and "KeyError: 'boom'" in raised.stderr
    message = interpreters.run([sys.executable, "-c", "import sys; sys.exit('bad')"], env=env, timeout=60)
    assert message.returncode == 1 and message.stderr == "bad\n"
    atexit = interpreters.run(
        [sys.executable, "-c", "import atexit; atexit.register(print, 'at exit'); print('body')"], env=env, timeout=60
    )
    assert atexit.stdout == "body\nat exit\n"
    proc = interpreters.popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    assert proc is not None and proc.poll() is None
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired) as e:
        interpreters.run(
            [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], env=env, timeout=3
        )
    assert e.value.output == "started\n"


def test_threads_share_one_server(interpreters):
    results: list[int] = []

    def start() -> None:
        ran = interpreters.run([sys.executable, "-c", "import os; print(os.getppid())"], env=_env(), timeout=120)
        results.append(int(ran.stdout))

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1 and results[0] != os.getpid(), results


def test_what_it_cannot_serve_starts_the_ordinary_way(interpreters):
    """Another value of a variable torch reads at import needs its own server: with
    the one server (max_servers=1) busy, the process starts the ordinary way; once
    that server is idle, it makes room for the other environment's."""
    busy = interpreters.popen([sys.executable, "-c", "import time; time.sleep(60)"], env=_env())
    assert busy is not None
    other = _env(TORCHINDUCTOR_COMPILE_THREADS="2")
    try:
        assert interpreters.popen([sys.executable, "-c", "pass"], env=other) is None
        ran = interpreters.run([sys.executable, "-c", "import os; print(os.getppid())"], env=other, timeout=60)
        assert int(ran.stdout) == os.getpid()  # started by this process, not by a server
    finally:
        busy.kill()
        busy.wait(10)
    builds = _builds(interpreters)
    ran = interpreters.run([sys.executable, "-c", "import os; print(os.getppid())"], env=other, timeout=120)
    assert int(ran.stdout) != os.getpid()  # the idle server made room for this environment's
    # the servers share one cache directory: the ISA probe's builds are the first server's, not made again
    assert builds and _builds(interpreters) == builds, (builds, _builds(interpreters))
    assert interpreters.popen([sys.executable, "-X", "dev", "-c", "pass"], env=_env()) is None  # an option


def _builds(interpreters: WarmInterpreters) -> dict[str, int]:
    """The shared libraries the servers built (inductor's vector-ISA probe), with their modification times."""
    return {p.name: p.stat().st_mtime_ns for p in Path(interpreters._workdir.name, warm._SERVERS_CACHE).rglob("*.so")}


def test_the_launcher_forks_its_ranks_only_inside_it():
    target = f"{ROOT / 'tests' / 'test_warm.py'}:_parent_and_modules"
    # its own (the session's may serve other environments already), preloading what the ranks look for
    with WarmInterpreters(preload=("torch", "torch._inductor.compile_fx"), max_servers=1):
        served = run_local_workers(target, 2, timeout=300)
    # outside every WarmInterpreters (this session's too, tests/conftest.py): an empty context
    cold = contextvars.Context().run(run_local_workers, target, 2, timeout=300)
    assert all(r["parent"] != os.getpid() and r["torch_before_target"] for r in served), served
    assert all(r["parent"] == os.getpid() for r in cold), cold


def _parent_and_modules(rank: int, world_size: int, payload: dict) -> dict:
    return {"parent": os.getppid(), "torch_before_target": "torch._inductor.compile_fx" in sys.modules}
