"""Cost of the input checks that name a bad subclass attribute, on compile time.

On every supported torch the library checks each subclass input where torch
first meets it (its attributes, and that ``__tensor_unflatten__`` rebuilds it) (Dynamo's ``VariableBuilder.wrap_tensor``; on torch 2.11 as part
of the backport, on 2.12+ as a diagnostic fix). The check runs while tracing,
never on a compiled call. This script measures what it adds to a compilation:
``torch.compile(fn, backend=BACKEND, fullgraph=True)`` of

    def fn(*xs):
        return tuple(x * 2 + 1 for x in xs)

with k nested ``MeshTensor`` arguments (two levels, one mesh per level), timed
from the first call to its return (Dynamo + AOTAutograd + the backend) after
``torch._dynamo.reset()``, alternately with the check on and suspended (the
rest of the library unchanged; which one goes first alternates too),
``--repeats`` times each; the median of each and their ratio are printed, and
the check's own cost per compilation, timed directly. The per-call cost is zero by construction (the
check is not in the compiled call's path); ``--calls`` also times compiled
calls with the check on and suspended to show it.

Usage::

    python benchmarks/bench_compile_checks.py [--backend aot_eager] [--k 8] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from subclasses import nested

import opaque_subclass
from opaque_subclass import activation

TARGET = "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor"


def _patch_set():  # the set holding the check on this torch
    for ps in (activation._PATCH_SET, activation._FIX_SET):
        if ps is not None and TARGET in ps.targets:
            return ps
    raise SystemExit(f"{TARGET} is not patched on torch {torch.__version__}: nothing to measure")


def _compile_once(k: int, backend: str) -> float:
    torch._dynamo.reset()
    xs = [nested(2) for _ in range(k)]
    fn = torch.compile(lambda *xs: tuple(x * 2 + 1 for x in xs), backend=backend, fullgraph=True)
    t0 = time.perf_counter()
    out = fn(*xs)
    elapsed = time.perf_counter() - t0
    assert all(o._mesh is x._mesh for o, x in zip(out, xs))
    return elapsed


def _calls(k: int, backend: str, n: int) -> float:
    torch._dynamo.reset()
    xs = [nested(2) for _ in range(k)]
    fn = torch.compile(lambda *xs: tuple(x * 2 + 1 for x in xs), backend=backend, fullgraph=True)
    fn(*xs)
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*xs)
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--k", type=int, default=8, help="subclass arguments (default 8)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=0, help="also time this many compiled calls per setting")
    args = parser.parse_args()
    ps = _patch_set()
    _compile_once(args.k, args.backend)  # warm-up: imports, first-compile costs
    on: list[float] = []
    off: list[float] = []
    for i in range(args.repeats):
        if i % 2:  # alternate which setting goes first, so drift hits both alike
            on.append(_compile_once(args.k, args.backend))
        with ps.suspended(TARGET):
            off.append(_compile_once(args.k, args.backend))
        if not i % 2:
            on.append(_compile_once(args.k, args.backend))
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(
        f"torch {torch.__version__}, opaque_subclass {opaque_subclass.__version__} ({opaque_subclass.support().mode}), "
        f"backend {args.backend}, k={args.k} nested MeshTensor arguments, {args.repeats} compilations each"
    )
    print(f"compile with the check   : median {m_on * 1e3:8.1f} ms")
    print(f"compile, check suspended : median {m_off * 1e3:8.1f} ms")
    print(f"ratio                    : {m_on / m_off:.4f}  ({(m_on / m_off - 1) * 100:+.2f}%)")
    from opaque_subclass.backport._machinery.hiding import validate_input

    xs = [nested(2) for _ in range(args.k)]
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        for x in xs:
            validate_input(x, "L['x']")
    direct = (time.perf_counter() - t0) / n
    print(
        f"the check itself         : {direct * 1e6:.1f} us for the {args.k} arguments "
        f"({direct / m_off * 100:.3f}% of the compilation)"
    )
    if args.calls:
        c_on = _calls(args.k, args.backend, args.calls)
        with ps.suspended(TARGET):
            c_off = _calls(args.k, args.backend, args.calls)
        print(f"compiled call            : {c_on * 1e6:.1f} us with the check, {c_off * 1e6:.1f} us suspended")


if __name__ == "__main__":
    main()
