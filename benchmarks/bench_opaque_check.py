"""Compile-time cost of the ``opaque_check`` backend against its inner backend.

``torch.compile(fn, backend=B, fullgraph=True)`` of

    def fn(*xs):
        return tuple(x * 2 + 1 for x in xs)

with k nested ``MeshTensor`` arguments (two levels, one mesh per level), timed
from the first call to its return after ``torch._dynamo.reset()``, with
``B = inner`` and ``B = compile_passes.checking_backend(inner, "record")``
alternately (which one goes first alternates too), ``--repeats`` times each.
Prints the medians and their ratio, the lints' own time per compilation (timed
directly on the captured graph), and the per-call time of both compiled
functions (the checking backend returns the inner backend's callable, so it
adds nothing to a call).

Usage::

    python benchmarks/bench_opaque_check.py [--inner aot_eager] [--k 8] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from subclasses import nested

import compile_passes


def fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(x * 2 + 1 for x in xs)


def _compile_time(backend: Any, args: list[torch.Tensor]) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    start = time.perf_counter()
    compiled(*args)
    return time.perf_counter() - start


def _call_time(backend: Any, args: list[torch.Tensor], calls: int) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    compiled(*args)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            compiled(*args)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inner", default="aot_eager")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    xs = [nested(2, data=torch.randn(16)) for _ in range(args.k)]
    checking = compile_passes.checking_backend(args.inner, "record")
    inner_times, checked_times = [], []
    for i in range(args.repeats):
        order = [(args.inner, inner_times), (checking, checked_times)]
        for backend, out in order if i % 2 == 0 else reversed(order):
            out.append(_compile_time(backend, xs))

    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    _compile_time(capture, xs)
    lint = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        check = compile_passes.check_graph(graphs[0])
        lint.append(time.perf_counter() - start)
    assert check.findings == (), check.findings  # the project's subclasses: nothing to report

    inner_m, checked_m = statistics.median(inner_times), statistics.median(checked_times)
    print(
        f"torch {torch.__version__}; inner backend {args.inner}; k={args.k} nested MeshTensor arguments; {args.repeats} compilations each"
    )
    print(f"compile, inner backend        : {inner_m * 1e3:8.1f} ms (median)")
    print(f"compile, opaque_check + inner : {checked_m * 1e3:8.1f} ms (median)  ratio {checked_m / inner_m:.3f}")
    print(
        f"lints alone per compilation   : {statistics.median(lint) * 1e3:8.2f} ms (median)  = {statistics.median(lint) / inner_m:.2%} of the inner compile"
    )
    call_inner = _call_time(args.inner, xs, args.calls)
    call_checked = _call_time(checking, xs, args.calls)
    print(f"compiled call, inner          : {call_inner * 1e6:8.1f} us")
    print(f"compiled call, opaque_check   : {call_checked * 1e6:8.1f} us  ratio {call_checked / call_inner:.3f}")


if __name__ == "__main__":
    main()
