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
the self-check ``python -m opaque_subclass --no-demo`` (the demo runs in the
suite: tests/test_demo.py, tests/test_torchrun.py) and then ``python -m pytest -v``
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
a default session. Nor is ``gpu``: the device tests (``tests/test_devices.py``)
on a CUDA GPU, per torch leg; it fails on a machine where torch sees no GPU.

``python -m nox`` also runs ``package``: it builds the sdist and the wheel,
checks their metadata and contents, installs the wheel with torch
``PACKAGE_TORCH`` in a new virtual environment and runs the self-check there,
from a directory outside the checkout.

``python -m nox`` also runs ``docs``: it builds the documentation site (the
guide of docs/*.md and the API reference of docs/api/) into docs/_build/html
with Sphinx, warnings as errors (broken links and anchors included).

Virtualenvs live outside the repository, in ``$OPAQUE_SUBCLASS_NOX_ENVDIR`` or
``~/.cache/opaque-subclass/nox``, and are reused when they exist (a fresh clone
does not download torch again). The project itself is reinstalled on every run,
so a machine without the cache works too, just slower.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator

import nox

TORCH_VERSIONS = ["2.11.0", "2.12.0", "2.13.0", "2.14.1", "2.15.0"]

# pytest-xdist workers a test session starts at most (one per CPU below that).
TEST_WORKERS_MAX = 4

# The lint session's pins: the tools' versions make results reproducible, and
# mypy checks calls into torch against this release's annotations.
RUFF_VERSION = "0.17.6"
MYPY_VERSION = "2.4.1"
LINT_TORCH = "2.14.1"

# The docs session's pins: Sphinx with MyST for the Markdown guide and autodoc
# (which reads the reST roles of the docstrings) for the API reference; the
# newest releases that still run on Python 3.10. autodoc imports the packages,
# so the session installs torch too (DOCS_TORCH, a CPU build kept on local disk).
SPHINX_VERSION = "8.1.3"
MYST_PARSER_VERSION = "4.0.1"
DOCUTILS_VERSION = "0.21.2"
FURO_VERSION = "2025.12.19"
DOCS_TORCH = "2.13.0"

# The package session's pins: the build front end and the metadata checks
# (twine; trove-classifiers, the list of classifiers PyPI accepts). The wheel's
# fresh environment gets torch PACKAGE_TORCH (a CPU build kept on local disk).
BUILD_VERSION = "1.6.1"
TWINE_VERSION = "7.0.0"
TROVE_CLASSIFIERS_VERSION = "2026.9.21.13"
PACKAGE_TORCH = "2.13.0"

nox.options.sessions = ["lint", "docs", "package", "tests"]
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

    Nothing (not even pip) when a reused virtualenv already has that version.
    pip's output is shown (``silent=False``): a first install downloads
    gigabytes, and a silent one looks like a hang.
    """
    if _installed_torch(session) == version:
        return
    for attempt in range(1, _INSTALL_ATTEMPTS + 1):
        try:
            session.install(f"torch=={version}", env=_PIP_ENV, silent=False)
            return
        except nox.command.CommandFailed:
            if attempt == _INSTALL_ATTEMPTS:
                session.error(f"pip could not install torch=={version} after {attempt} attempts")
            session.warn(f"installing torch=={version} failed (attempt {attempt}); retrying")


# What the virtualenv has, read from the installed package's metadata (torch is not imported).
_TORCH_METADATA = (
    "import importlib.metadata as m; d = next(iter(m.distributions(name='torch')), None); "
    "print(d.version.split('+')[0] if d else '')"
)


def _installed_torch(session: nox.Session) -> str:
    """The torch release in the session's virtualenv (``2.13.0`` for ``2.13.0+cpu``), or ``""``."""
    out = session.run("python", "-c", _TORCH_METADATA, silent=True)
    return out.strip() if isinstance(out, str) else ""


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
    # The self-check prints the torch release first, then its checks; its demo (2 gloo ranks
    # training under torch.compile) runs in the suite below, as tests/test_demo.py and under
    # torchrun (tests/test_torchrun.py): run here too, it cost each leg about 25 s more for
    # nothing the suite does not check.
    with _fresh_inductor_cache() as env:
        session.run("python", "-m", "opaque_subclass", "--no-demo", env=env)
    # -v: one line per test as it finishes (the default prints a dot per test,
    # and one long file can go minutes without a new line); the summary line
    # "N passed ... in X.XXs" is the same. Arguments after -- come after it
    # (-q there gives the default dots back; -n 0 runs in this process). Any
    # non-zero exit fails the session, including 5 (no tests collected). --durations: the 20
    # slowest tests of the leg, where its time goes (CI's budget is shared by five legs).
    with _fresh_inductor_cache() as env:
        session.run("python", "-m", "pytest", "-v", "--durations=20", *_workers(), *session.posargs, env=env)


def _workers() -> list[str]:
    """pytest-xdist's options: one worker process per CPU, at most
    ``TEST_WORKERS_MAX`` (``$OPAQUE_SUBCLASS_TEST_WORKERS`` sets the number; 0
    runs the tests in pytest's own process). Much of a test's time is one Python
    thread compiling, but many tests already keep both cores busy (real ranks,
    fresh interpreters, inductor's compile workers): on the 2-core CI machine,
    with two workers the legs took 13, 12 and 11 minutes (2.11, 2.12, 2.13)
    where one worker took 13, 13 and 8 at the previous landing, with about 1.5
    minutes of tests per leg added since. Each worker is its own process, and gets its own inductor
    cache directory under the session's (tests/conftest.py): a cache is never
    shared between processes that did not choose to share it. Tests of one
    ``xdist_group`` run in one worker (``--dist loadgroup``), e.g. a module whose
    fixture starts real ranks once for all its tests."""
    wanted = os.environ.get("OPAQUE_SUBCLASS_TEST_WORKERS")
    workers = int(wanted) if wanted else min(os.cpu_count() or 1, TEST_WORKERS_MAX)
    return ["-n", str(workers), "--dist", "loadgroup"] if workers > 0 else ["-n", "0"]


#: The packages whose subclasses the library adopts (opaque_subclass.adoption's presets), with
#: the torch releases the ``clients`` session tests them on (one leg each).
CLIENTS = ("nvidia-physicsnemo==2.2.2",)
CLIENTS_TORCH = ["2.13.0", "2.15.0"]


@nox.session
@nox.parametrize("torch", CLIENTS_TORCH)
def clients(session: nox.Session, torch: str) -> None:
    """The adoption presets on the real packages, on one torch leg of CLIENTS_TORCH
    (not a default session: they are large, and the default legs test stand-ins of
    the same traits), e.g. ``python -m nox -s "clients(torch='2.15.0')"``: NVIDIA
    PhysicsNeMo's ``ShardTensor`` (tests/test_adopt_physicsnemo.py: either import
    order, 8 meshes of one shape, collectives on each call's group, 2 gloo ranks,
    a simulated 64-rank job) and docs/adopting.md's recipe on it."""
    _install_torch(session, torch)
    session.install("-e", ".[test]", *CLIENTS, f"torch=={torch}", env=_PIP_ENV)
    session.run(
        "python",
        "-c",
        "import torch, physicsnemo; print('torch', torch.__version__, 'physicsnemo', physicsnemo.__version__)",
    )
    with _fresh_inductor_cache() as env:
        session.run(
            "python",
            "-m",
            "pytest",
            *("-v", "-n", "0", "--durations=20", "tests/test_adopt_physicsnemo.py"),
            *session.posargs,
            env=env,
        )
        session.run("python", "docs/check_examples.py", "docs/adopting.md", env=env)


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
def docs(session: nox.Session) -> None:
    """The documentation site, in docs/_build/html: the guide (docs/*.md, MyST)
    and the API reference (docs/api/*.rst, autodoc), on torch DOCS_TORCH.

    Every build starts from scratch and fails on any warning (-W), so a broken
    link between pages, a link to a missing anchor or a docstring that does not
    render fails the session. Settings: docs/conf.py."""
    _install_torch(session, DOCS_TORCH)
    session.install(
        f"sphinx=={SPHINX_VERSION}",
        f"myst-parser=={MYST_PARSER_VERSION}",
        f"docutils=={DOCUTILS_VERSION}",
        f"furo=={FURO_VERSION}",
        "-e",
        ".",
        f"torch=={DOCS_TORCH}",
        env=_PIP_ENV,
    )
    shutil.rmtree("docs/_build", ignore_errors=True)
    session.run(
        "sphinx-build",
        *("--fail-on-warning", "--keep-going", "--fresh-env"),
        *("--builder", "html", "--doctree-dir", "docs/_build/doctrees"),
        *("docs", "docs/_build/html"),
    )


# Files a wheel must carry beyond the packages' modules: the PEP 561 markers and the
# release table's recorded source digests (package data), the top-level module
# outside both packages, the version module pyproject.toml reads.
_WHEEL_FILES = (
    "opaque_subclass/py.typed",
    "opaque_subclass/releases/sources.json",
    "compile_passes/py.typed",
    "_opaque_subclass_pickle.py",
    "opaque_subclass/_version.py",
)

# Run with the session's python, on the wheel (argv[1]): every classifier of its
# metadata must be one PyPI accepts (twine check does not look at them).
_CLASSIFIERS_CHECK = """\
import sys, zipfile
from email.parser import HeaderParser
from trove_classifiers import classifiers
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    found = HeaderParser().parsestr(wheel.read(name).decode()).get_all("Classifier") or []
unknown = [c for c in found if c not in classifiers]
if unknown:
    sys.exit(f"classifiers PyPI does not know (an upload would be refused): {unknown}")
print(f"{len(found)} classifiers, all known to trove-classifiers")
"""

# Run by the wheel's own environment, from a directory outside the checkout and
# without PYTHONPATH: what the wheel installed, read back through the import
# system and the installed metadata.
_INSTALLED_CHECK = """\
import importlib.metadata, importlib.resources, sys, sysconfig
from pathlib import Path
import _opaque_subclass_pickle, compile_passes, opaque_subclass
site = Path(sysconfig.get_paths()["purelib"]).resolve()
dist = importlib.metadata.distribution("opaque-subclass")
problems = [
    f"{m.__name__} was imported from {m.__file__}, not from {site}"
    for m in (opaque_subclass, compile_passes, _opaque_subclass_pickle)
    if not Path(m.__file__).resolve().is_relative_to(site)
]
problems += [
    f"{p}/py.typed is not installed" for p in ("opaque_subclass", "compile_passes")
    if not importlib.resources.files(p).joinpath("py.typed").is_file()
]
if dist.version != opaque_subclass.__version__:
    problems.append(f"metadata version {dist.version} != opaque_subclass.__version__ {opaque_subclass.__version__}")
licenses = [f for f in dist.files or () if f.name == "LICENSE" and f.parts[0].endswith(".dist-info")]
if not licenses or not all(Path(dist.locate_file(f)).is_file() for f in licenses):
    problems.append(f"no LICENSE installed in the .dist-info: {licenses}")
points = {(e.group, e.name): e.value for e in dist.entry_points}
for key, value in {
    ("console_scripts", "opaque-subclass"): "opaque_subclass.cli:main",
    ("torch_dynamo_backends", "opaque_check"): "compile_passes.backend:opaque_check",
}.items():
    if points.get(key) != value:
        problems.append(f"entry point {key} is {points.get(key)!r}, expected {value!r}")
if problems:
    sys.exit("the installed wheel is incomplete:\\n  " + "\\n  ".join(problems))
print(f"opaque-subclass {dist.version} installed in {site}: modules, py.typed, LICENSE, entry points")
"""


def _write(folder: str, name: str, text: str) -> str:
    """Write ``text`` to ``folder/name``; return the path (a script nox's log names
    in one line, where ``python -c`` would print the whole source)."""
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _check_archives(session: nox.Session, sdist: str, wheel: str) -> None:
    """LICENSE, identical to the checkout's, in the sdist's root and in the
    wheel's ``.dist-info``; the wheel holds every file of ``_WHEEL_FILES``."""
    with open("LICENSE", "rb") as f:
        license_text = f.read()
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        in_wheel = [z.read(n) for n in names if n.split("/")[0].endswith(".dist-info") and n.endswith("/LICENSE")]
    with tarfile.open(sdist) as t:
        # the sdist's root is its one top folder, opaque_subclass-<version>/
        files = [t.extractfile(m) for m in t.getmembers() if m.name.split("/", 1)[1:] == ["LICENSE"]]
        in_sdist = [f.read() for f in files if f is not None]
    problems = [f"{name} is not in the wheel" for name in _WHEEL_FILES if name not in names]
    if in_wheel != [license_text]:
        problems.append(f"the wheel's .dist-info holds {len(in_wheel)} LICENSE file(s), expected the checkout's one")
    if in_sdist != [license_text]:
        problems.append("the sdist has no LICENSE at its root, or another one than the checkout's")
    if problems:
        session.error("; ".join(problems))
    session.log(f"LICENSE in the sdist and the wheel's .dist-info; {', '.join(_WHEEL_FILES)} in the wheel")


@nox.session
def package(session: nox.Session) -> None:
    """The release's sdist and wheel, built, checked and installed as a user gets them.

    ``python -m build`` makes the sdist and, from it, the wheel (an isolated
    build: pip fetches ``[build-system] requires``), in a temporary directory;
    ``twine check --strict`` checks their metadata, trove-classifiers every
    classifier. The archives must hold LICENSE (the wheel in its
    ``.dist-info``) and the files of ``_WHEEL_FILES``. A new virtual
    environment (``python -m venv``, in the session's temporary directory,
    outside the repository) then gets the wheel and ``torch==PACKAGE_TORCH``;
    from a directory outside the checkout, without ``PYTHONPATH``, it checks
    what was installed (modules from site-packages, ``py.typed``, LICENSE,
    entry points, metadata version equal to ``opaque_subclass.__version__``)
    and runs ``python -m opaque_subclass --no-demo``, which must exit 0. The
    temporary directory is removed at the end."""
    session.install(
        f"build=={BUILD_VERSION}",
        f"twine=={TWINE_VERSION}",
        f"trove-classifiers=={TROVE_CLASSIFIERS_VERSION}",
        env=_PIP_ENV,
    )
    work = tempfile.mkdtemp(prefix="package-", dir=session.create_tmp())
    try:
        dist = os.path.join(work, "dist")
        # silent: setuptools lists every file it copies (its output is shown if the build fails)
        session.run("python", "-m", "build", "--outdir", dist, ".", env=_PIP_ENV, silent=True)
        (sdist,) = glob.glob(os.path.join(dist, "*.tar.gz"))
        (wheel,) = glob.glob(os.path.join(dist, "*.whl"))
        session.log(f"built {os.path.basename(sdist)} and {os.path.basename(wheel)}")
        session.run("twine", "check", "--strict", sdist, wheel)
        session.run("python", _write(work, "check_classifiers.py", _CLASSIFIERS_CHECK), wheel)
        _check_archives(session, sdist, wheel)

        venv = os.path.join(work, "venv")
        session.run("python", "-m", "venv", venv)
        python = os.path.join(venv, "bin", "python")
        session.run(python, "-m", "pip", "install", wheel, f"torch=={PACKAGE_TORCH}", env=_PIP_ENV, external=True)
        # sys.path starts with the script's folder (python script.py) or the current
        # directory (python -m): both are this folder, outside the checkout
        outside = os.path.join(work, "run")
        os.mkdir(outside)
        check = _write(outside, "check_installed.py", _INSTALLED_CHECK)
        with session.chdir(outside), _fresh_inductor_cache() as cache_env:
            env: dict[str, str | None] = {**cache_env, "PYTHONPATH": None}  # None: unset for the command
            session.run(python, check, env=env, external=True)
            session.run(python, "-m", "opaque_subclass", "--no-demo", env=env, external=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@nox.session
@nox.parametrize("torch", TORCH_VERSIONS)
def bench(session: nox.Session, torch: str) -> None:
    """Benchmarks (not run by default): run-time wrap/unwrap against torch's helpers,
    compiled-call overhead against plain tensors, per call against the hand-written floor
    and stock torch (paired), and simulated jobs of up to 8192 ranks (compilations and
    cache hits per job), on each torch leg."""
    _install_torch(session, torch)
    _install_project(session, torch)
    session.run("python", "benchmarks/bench_runtime.py")
    session.run("python", "benchmarks/bench_compiled.py", *session.posargs)
    session.run("python", "benchmarks/bench_per_call.py", "--ks", "1,8,64", "--backends", "aot_eager")
    session.run("python", "benchmarks/bench_compile_checks.py")
    session.run("python", "benchmarks/bench_export.py")
    session.run("python", "benchmarks/bench_opaque_check.py")
    session.run("python", "benchmarks/bench_job_compile.py")


# Run with the gpu session's python: one line, "cuda=<is_available> build=<torch.version.cuda>".
_CUDA_CHECK = "import torch; print(f'cuda={torch.cuda.is_available()} build={torch.version.cuda}')"


@nox.session
@nox.parametrize("torch", TORCH_VERSIONS)
def gpu(session: nox.Session, torch: str) -> None:
    """The device tests (tests/test_devices.py) on a CUDA GPU, on one torch leg; not a
    default session (CI is CPU-only).

    Each leg installs ``torch==<version>`` as pip resolves it: the default PyPI
    wheels for Linux x86_64 are CUDA builds; a CPU wheel that pip finds first (on
    the machine this was written on, torch 2.13.0+cpu kept on local disk) is not,
    and the session then stops. It stops unless torch sees a GPU, and the tests run
    with OPAQUE_SUBCLASS_REQUIRE_CUDA=1, which fails a cuda case instead of skipping
    it: a GPU session cannot pass by skipping."""
    _install_torch(session, torch)
    found = session.run("python", "-c", _CUDA_CHECK, silent=True)
    line = next((s for s in str(found).splitlines() if s.startswith("cuda=")), str(found))
    if not line.startswith("cuda=True "):
        build = line.partition("build=")[2] or "unknown"
        what = "a CPU-only build" if build == "None" else f"a CUDA {build} build that sees no GPU"
        session.error(
            f"torch {torch} in this session is {what}: torch.cuda.is_available() is False. "
            "The gpu session runs the device tests on a CUDA GPU and refuses to pass by skipping them; "
            "run it on a machine with a GPU and a CUDA build of torch."
        )
    _install_project(session, torch)
    with _fresh_inductor_cache() as env:
        env["OPAQUE_SUBCLASS_REQUIRE_CUDA"] = "1"
        session.run("python", "-m", "pytest", "-v", "tests/test_devices.py", *session.posargs, env=env)
