"""Run torch's own tests with and without the library, and name what only the library breaks.

A library imported into someone's process must not change what torch does for
code that never uses it. This runs test files of PyTorch's (such as upstream's
``test/test_opaque_obj_v2.py``, from a checkout or a stored copy: the files stay
outside this project) twice on the running interpreter's torch, each run in a
fresh interpreter with its own ``TORCHINDUCTOR_CACHE_DIR``:

- *stock*: pytest alone (the run fails if anything imported ``opaque_subclass``);
- *with the library*: ``import opaque_subclass`` before pytest collects.

It compares the outcome of every test and prints the tests that fail only with
the library, those the library fixes and those that fail either way::

    python tools/torch_tests.py /path/to/test_opaque_obj_v2.py
    python tools/torch_tests.py FILE --python ~/.venvs/torch-2.13/bin/python --json out.json
    python tools/torch_tests.py FILE -- -k "Subclass"      # arguments after -- go to pytest

A test failing either way but with another first line of its failure (another
graph, another error) is reported too: the library changed what torch does.

Exit status: 0 when no test fails only with the library (or differently), 1 when
some do, 2 when a run could not be made (a file that does not collect, a timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: What the child interpreter runs: argv = mode, test file, junit path, pytest arguments.
_CHILD = """
import os, sys
mode, test_file, junit, *extra = sys.argv[1:]
if mode == "library":
    import opaque_subclass  # before pytest imports the test file and torch's test helpers
import pytest
folder = os.path.dirname(os.path.abspath(test_file))
code = pytest.main([
    test_file, "-q", "-p", "no:cacheprovider", "--tb=line", "-c", os.devnull, "--rootdir", folder,
    f"--junitxml={junit}", *extra,
])
if mode == "stock" and "opaque_subclass" in sys.modules:
    print("torch_tests: the stock run imported opaque_subclass", file=sys.stderr)
    sys.exit(3)
sys.exit(0 if code in (0, 1) else int(code))
"""


@dataclass(frozen=True)
class Outcome:
    """One test's result in one run: ``passed``, ``failed``, ``skipped``."""

    result: str
    message: str = ""


@dataclass
class Run:
    """One pytest run of a file: each test's outcome, by ``Class.test_name``."""

    mode: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    problem: str = ""

    def failed(self) -> set[str]:
        return {name for name, o in self.outcomes.items() if o.result == "failed"}


def _outcomes(junit: Path) -> dict[str, Outcome]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            text = (bad.get("message") or bad.text or "").strip().splitlines()
            out[name] = Outcome("failed", text[0][:300] if text else "")
        elif case.find("skipped") is not None:
            out[name] = Outcome("skipped")
        else:
            out[name] = Outcome("passed")
    return out


def run_file(python: str, test_file: Path, mode: str, pytest_args: list[str], timeout: float) -> Run:
    """Run ``test_file`` under ``python`` in ``mode`` (``stock`` or ``library``)."""
    with tempfile.TemporaryDirectory(prefix="torch_tests-") as scratch:
        junit = Path(scratch) / "junit.xml"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(scratch) / "inductor")}
        command = [python, "-c", _CHILD, mode, str(test_file), str(junit), *pytest_args]
        try:
            done = subprocess.run(
                command, cwd=test_file.parent, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return Run(mode, problem=f"timed out after {timeout:.0f} s")
        if done.returncode != 0 or not junit.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return Run(mode, problem=f"exit {done.returncode}: " + " | ".join(tail))
        return Run(mode, _outcomes(junit))


def _torch_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "?"


#: An object's address in a repr (``<Counter object at 0x7f...>``): another in every process.
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")


def _alike(a: Outcome, b: Outcome) -> bool:
    """Whether two failures read the same, but for the addresses of objects."""
    return _ADDRESS.sub("0x?", a.message) == _ADDRESS.sub("0x?", b.message)


def compare(stock: Run, library: Run) -> dict[str, list[str]]:
    """Test names by how the two runs differ."""
    names = sorted(set(stock.outcomes) | set(library.outcomes))
    bad_stock, bad_library = stock.failed(), library.failed()
    return {
        "only_with_library": [n for n in names if n in bad_library and n not in bad_stock],
        "fixed_by_library": [n for n in names if n in bad_stock and n not in bad_library],
        "failing_both": [n for n in names if n in bad_stock and n in bad_library],
        # failing either way, but not alike: the library changed what torch does (another graph, another error)
        "failing_differently": [
            n
            for n in names
            if n in bad_stock and n in bad_library and not _alike(stock.outcomes[n], library.outcomes[n])
        ],
        "missing": [n for n in names if (n in stock.outcomes) != (n in library.outcomes)],
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="torch test files (outside this project)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch runs them")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (default 1800)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    version = _torch_version(args.python)
    report = {"torch": version, "files": {}}
    status = 0
    for test_file in args.files:
        test_file = test_file.resolve()
        stock = run_file(args.python, test_file, "stock", pytest_args, args.timeout)
        library = run_file(args.python, test_file, "library", pytest_args, args.timeout)
        print(f"torch {version}: {test_file.name}")
        problems = [f"{r.mode} run: {r.problem}" for r in (stock, library) if r.problem]
        if problems:
            print("\n".join("  " + p for p in problems))
            report["files"][str(test_file)] = {"problems": problems}
            status = 2
            continue
        diff = compare(stock, library)
        print(
            f"  {len(stock.outcomes)} tests; failed: stock {len(stock.failed())}, with the library "
            f"{len(library.failed())}; failing only with the library: {len(diff['only_with_library'])}; failing "
            f"either way but not alike: {len(diff['failing_differently'])}"
        )
        for title, key, run in (
            ("failing only with the library", "only_with_library", library),
            ("fixed by the library", "fixed_by_library", stock),
            ("failing either way", "failing_both", library),
        ):
            if key == "failing_both":
                for name in diff["failing_differently"]:
                    print(f"  failing either way, not alike: {name}")
                    print(f"    stock:   {stock.outcomes[name].message}")
                    print(f"    library: {library.outcomes[name].message}")
            if diff[key]:
                print(f"  {title} ({len(diff[key])}):")
                for name in diff[key]:
                    message = run.outcomes[name].message
                    print(f"    {name}" + (f": {message}" if message else ""))
        report["files"][str(test_file)] = {
            **diff,
            "stock": {n: asdict(o) for n, o in stock.outcomes.items()},
            "library": {n: asdict(o) for n, o in library.outcomes.items()},
        }
        if diff["only_with_library"] or diff["failing_differently"]:
            status = max(status, 1)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
