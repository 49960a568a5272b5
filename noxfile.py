"""Test matrix for opaque-subclass.

``python -m nox`` runs the ``tests`` session on five torch legs, one per
supported release (``opaque_subclass/releases/`` is the table of what each
one gets):

* ``tests(torch='2.11.0')`` - backport mode;
* ``tests(torch='2.12.0')`` - native mode, with the fixes for 2.12's bugs;
* ``tests(torch='2.13.0')``, ``tests(torch='2.14.1')``, ``tests(torch='2.15.0')``
  - native mode (2.14 renamed opaque objects "custom classes").

Each leg has its own virtualenv. torch is installed first, pinned, and pinned
again next to the project so pip never swaps it for another build. Each leg runs
the self-check ``python -m opaque_subclass`` and then ``python -m pytest -v``
(extra arguments after ``--`` go to pytest: ``python -m nox -- -k flatten``).

Progress shows as it happens: pip's output for the torch install is not
silenced (a first install downloads about 5 GB; a reused virtualenv prints
"Requirement already satisfied"), pytest prints one line per test as it
finishes (``tests/test_walk.py::test_... PASSED [ 12%]``), and both commands
run with ``PYTHONUNBUFFERED=1`` so lines reach a pipe or log file at once.
pytest's summary line (``N passed ... in X.XXs``) and nox's ``Session ... was
successful`` lines are unchanged (``.ci/run`` reads them).

``python -m nox`` also runs ``lint`` (first, it is quick): ``ruff check``,
``ruff format --check`` and ``mypy`` (strict, against torch ``LINT_TORCH``),
with pinned tool versions.

Each command gets its own empty ``TORCHINDUCTOR_CACHE_DIR``.
``python -m nox -s bench`` runs the benchmarks on every torch leg; it is not
a default session.

Virtualenvs live outside the repository, in ``$OPAQUE_SUBCLASS_NOX_ENVDIR`` or
``~/.cache/opaque-subclass/nox``, and are reused when they exist (a fresh clone
does not download torch again). The project itself is reinstalled on every run,
so a machine without the cache works too, just slower.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

import nox

TORCH_VERSIONS = ["2.11.0", "2.12.0", "2.13.0", "2.14.1", "2.15.0"]

# The lint session's pins: the tools' versions make results reproducible, and
# mypy checks calls into torch against this release's annotations.
RUFF_VERSION = "0.17.6"
MYPY_VERSION = "2.4.1"
LINT_TORCH = "2.14.1"

nox.options.sessions = ["lint", "tests"]
nox.options.envdir = os.environ.get(
    "OPAQUE_SUBCLASS_NOX_ENVDIR",
    os.path.expanduser("~/.cache/opaque-subclass/nox"),
)
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True

# torch wheels are large (2.11 from the registry is a CUDA build, ~4.7 GB with
# its nvidia-* packages); a dropped connection gets a few more tries.
_INSTALL_ATTEMPTS = 3

# Some machines cap torch through a pip constraints file (here: torch<=2.14.1,
# the releases kept on local disk). The legs pin exact releases themselves, so
# that machine-wide cap is lifted for the project's own installs.
_PIP_ENV = {"PIP_CONSTRAINT": "/dev/null"}


def _install_torch(session: nox.Session, version: str) -> None:
    """Install ``torch==version`` before anything else, retrying on failure.

    A no-op (no network) when a reused virtualenv already has that version.
    pip's output is shown (``silent=False``): a first install downloads
    gigabytes, and a silent one looks like a hang.
    """
    for attempt in range(1, _INSTALL_ATTEMPTS + 1):
        try:
            session.install(f"torch=={version}", env=_PIP_ENV, silent=False)
            return
        except nox.command.CommandFailed:
            if attempt == _INSTALL_ATTEMPTS:
                session.error(f"pip could not install torch=={version} after {attempt} attempts")
            session.warn(f"installing torch=={version} failed (attempt {attempt}); retrying")


def _install_project(session: nox.Session, torch_version: str, extra: str = "test") -> None:
    # The torch pin on the same command line keeps pip's resolver from
    # replacing the torch installed above.
    session.install("-e", f".[{extra}]", f"torch=={torch_version}", env=_PIP_ENV)


@contextlib.contextmanager
def _fresh_inductor_cache() -> Iterator[dict[str, str]]:
    """A new, empty TORCHINDUCTOR_CACHE_DIR for one command (torch's compile
    caches shared between processes leak state between them), and unbuffered
    output, so that the command's lines reach a pipe or a log as they are printed."""
    path = tempfile.mkdtemp(prefix="opaque-subclass-inductor-")
    try:
        yield {"TORCHINDUCTOR_CACHE_DIR": path, "PYTHONUNBUFFERED": "1"}
    finally:
        shutil.rmtree(path, ignore_errors=True)


@nox.session
@nox.parametrize("torch", TORCH_VERSIONS)
def tests(session: nox.Session, torch: str) -> None:
    """Self-check and test suite on one torch version."""
    _install_torch(session, torch)
    _install_project(session, torch)
    session.run("python", "-c", "import torch; print('torch', torch.__version__)")
    with _fresh_inductor_cache() as env:
        session.run("python", "-m", "opaque_subclass", env=env)
    # -v: one line per test as it finishes (the default prints a dot per test,
    # and one long file can go minutes without a new line); the summary line
    # "N passed ... in X.XXs" is the same. Arguments after -- come after it
    # (-q there gives the default dots back). Any non-zero exit fails the
    # session, including 5 (no tests collected).
    with _fresh_inductor_cache() as env:
        session.run("python", "-m", "pytest", "-v", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and strict mypy, on torch LINT_TORCH.

    Both tools take their settings from pyproject.toml; ruff covers the whole
    repository, mypy the packages (its ``files``)."""
    _install_torch(session, LINT_TORCH)
    session.install(f"ruff=={RUFF_VERSION}", f"mypy=={MYPY_VERSION}", f"torch=={LINT_TORCH}", env=_PIP_ENV)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # mypy runs on the session's python, so it reads torch's annotations there
    session.run("mypy")


@nox.session
@nox.parametrize("torch", TORCH_VERSIONS)
def bench(session: nox.Session, torch: str) -> None:
    """Benchmarks (not run by default): run-time wrap/unwrap against torch's helpers,
    and compiled-call overhead against plain tensors, on each torch leg."""
    _install_torch(session, torch)
    _install_project(session, torch)
    session.run("python", "benchmarks/bench_runtime.py")
    session.run("python", "benchmarks/bench_compiled.py", *session.posargs)
    session.run("python", "benchmarks/bench_compile_checks.py")
    session.run("python", "benchmarks/bench_export.py")
    session.run("python", "benchmarks/bench_opaque_check.py")
