import os
import sys
import tempfile

# Under pytest-xdist (noxfile.py runs the suite with one worker per CPU) each worker
# process gets its own inductor cache, a folder of the session's: torch's compile
# caches shared between processes leak state between them. Set before anything
# compiles; the worker's subprocesses inherit it, as a serial run's do.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    _BASE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = (
        os.path.join(_BASE, _WORKER) if _BASE else tempfile.mkdtemp(prefix=f"opaque-subclass-inductor-{_WORKER}-")
    )

# Inductor compiles in the process that asks (TORCHINDUCTOR_COMPILE_THREADS=1) unless the caller
# chose otherwise: with its default on this 2-core machine (one thread per CPU) every process that
# compiles with inductor first starts a pool of compile workers, a fresh interpreter importing torch,
# which for the suite's small graphs costs more than the compilation (test_compile_cache's two
# cross-process tests: 94 s instead of 352 s, 2.13). The subprocesses of tests inherit it. The pool
# stays covered: tests/test_compile_workers.py compiles with it on every leg.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The devices of the device tests (tests/test_devices.py): "cpu" always, "cuda" where torch sees
# a GPU. Without one, a "cuda" case is skipped with NO_CUDA, or fails with it when
# OPAQUE_SUBCLASS_REQUIRE_CUDA=1 (`python -m nox -s gpu` sets it: a GPU run that skips is a defect).
DEVICES = ("cpu", "cuda")
NO_CUDA = "no CUDA GPU here (torch.cuda.is_available() is False); `python -m nox -s gpu` runs the cuda cases on a GPU"


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """The device a test puts its tensors on (see DEVICES)."""
    if request.param == "cuda" and not torch.cuda.is_available():
        if os.environ.get("OPAQUE_SUBCLASS_REQUIRE_CUDA") == "1":
            pytest.fail(f"OPAQUE_SUBCLASS_REQUIRE_CUDA=1 but {NO_CUDA}", pytrace=False)
        pytest.skip(NO_CUDA)
    return str(request.param)


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--dist loadgroup``, pytest-xdist puts the tests of one ``xdist_group`` in one worker
    by adding ``@<group>`` to their node ids. pytest 9.2 keeps node ids where pytest-xdist (3.8)
    cannot change them: the groups are silently spread over the workers, and tests that share a
    scenario (tests/scenarios.py) or a fixture of real ranks run it once per worker. Refused here,
    with the fix."""
    if config.getoption("dist", None) != "loadgroup":
        return
    major, minor = (int(part) for part in pytest.__version__.split(".")[:2])
    if (major, minor) >= (9, 2):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests with pytest {pytest.__version__} (pytest-xdist sets a node "
            "id attribute pytest 9.2 no longer reads): install the versions pyproject.toml's test extra allows "
            "(python -m pip install -e '.[test]')"
        )


@pytest.fixture(scope="session", autouse=True)
def warm_interpreters():
    """The processes that the launcher (run_local_workers, simulate_job) starts in the tests'
    own thread, and those that tests start through ``opaque_subclass.testing.warm.run``, are
    forked from a server that imported torch, Dynamo and Inductor (WarmInterpreters): about
    5 s of CPU less per process, which was most of a leg's time. A process whose environment
    differs in what torch reads at import, or started on another thread, is a new interpreter.
    tests/test_warm.py checks what a served process gets; OPAQUE_SUBCLASS_COLD_STARTS=1 starts
    every process the ordinary way."""
    if os.environ.get("OPAQUE_SUBCLASS_COLD_STARTS") == "1":
        yield None
        return
    from opaque_subclass.testing import WarmInterpreters

    # servers for up to 4 environments: the launcher's (OMP_NUM_THREADS=1), the tests' own, and those
    # of tests that set a variable torch reads at import (CI of stop 43: with 2, the launcher's ranks
    # of a worker found both taken and started cold)
    with WarmInterpreters(max_servers=4) as warm:
        yield warm
