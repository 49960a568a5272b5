"""Benchmark of the per-call overhead of a compiled function with opaque-attr subclass arguments.

For k = 1, 8, 64 the same function

    def fn(*xs):
        return tuple([x * 2 + 1 for x in xs])

is compiled with ``torch.compile(fn, backend=BACKEND, fullgraph=True)`` and called
with k arguments of one of these kinds:

* ``plain``  - ``torch.randn(16)``;
* ``own``    - ``MeshTensor(torch.randn(16), Mesh(...))``, every argument with its
  own ``Mesh`` (a reference opaque);
* ``shared`` - the same, but all k arguments share one ``Mesh``;
* ``tensor-only`` (reference row) - ``DataTensor(torch.randn(16))``, the same
  wrapper subclass without the mesh (``__tensor_flatten__`` lists one tensor, no
  opaque): what torch's runtime charges for a wrapper subclass as such. Not
  covered by ``--check-ratio``.

``Mesh`` and ``MeshTensor`` are the test suite's fixtures (``tests/subclasses.py``,
also used by the end-to-end scenario suite ``test_opaque_obj_v2.py``):
``MeshTensor.__tensor_flatten__`` returns ``["_data", "_mesh"], None``.

The function returns one result per argument, so with subclass arguments every
call pays for the unwrap of the k inputs (k tensors + k opaques, or k tensors + 1
opaque when shared, enter the graph) *and* for the wrap of k subclass outputs,
each rebuilt around the runtime opaque that the graph passes through. The ratio
``subclass us/call / plain us/call`` is the overhead of the subclass machinery on
this function (the ``plain`` cell of the same k, same run, is the denominator of
every row); the graph's own work (2k small eager kernels with ``aot_eager``,
one fused kernel with ``inductor``) is the same in both.

Each (kind, k) gets its own code object, so Dynamo's cache for one cell never
holds another cell's entries. Before timing, every subclass cell is called with
fresh meshes (and fresh tensors) a few times: the outputs must be ``MeshTensor``s
carrying the meshes of *that* call (by identity) with the right values, and
nothing may recompile. Then each cell is timed with a loop of n calls (n
calibrated so that one loop takes at least ``--target-ms``, 30 ms by default),
with the cyclic garbage collector off during the loop; the loops are repeated
``--repeats`` times round-robin over all cells, so drift of the machine hits
plain and subclass cells alike. The table shows the minimum per call over the
repeats (``--stat median`` for the median; both are in the JSON), and the ratio
is taken from that statistic.

torch's AOTAutograd cache and inductor's FX graph cache are disabled (every cell
compiles from scratch, as in the scenario suite). Autograd stays enabled (no
``torch.no_grad()``); by default the inputs do not require grad. With ``--grad``
they do (``requires_grad_(True)``): AOTAutograd then compiles a joint graph and
each call builds an autograd node; only the forward call is timed.

Usage::

    python benchmarks/bench_compiled.py [--backend inductor] [--grad]
        [--json PATH] [--check-ratio X]

See benchmarks/README.md ("Compiled-call overhead") for the columns.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo
import torch._dynamo.utils
import torch._functorch.config
import torch._inductor.config
from torch.utils._pytree import tree_map_only

import opaque_subclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from subclasses import Mesh, MeshTensor  # the test suite's opaque and subclass (fixtures)

KS = (1, 8, 64)
KINDS = ("plain", "own", "shared", "tensor-only")
CHECKED_KINDS = ("own", "shared")
SIZE = 16


class DataTensor(torch.Tensor):
    """Reference row: ``MeshTensor`` without the mesh, a wrapper subclass whose
    ``__tensor_flatten__`` lists one tensor and no opaque. What torch charges per
    call for a wrapper subclass argument/output, opaques aside."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> DataTensor:
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            data.shape,
            strides=data.stride(),
            dtype=data.dtype,
            device=data.device,
            requires_grad=data.requires_grad,
        )
        r._data = data
        return r  # type: ignore[no-any-return]

    def __init__(self, data: torch.Tensor) -> None:
        pass

    def __repr__(self) -> str:  # data-free
        return f"DataTensor(shape={tuple(self.shape)})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_data"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: None, size: Any, stride: Any) -> DataTensor:
        return DataTensor(inner["_data"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        unwrap = lambda t: t._data  # noqa: E731
        out = func(*tree_map_only(DataTensor, unwrap, args), **tree_map_only(DataTensor, unwrap, kwargs or {}))
        return tree_map_only(torch.Tensor, DataTensor, out)


def _fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple([x * 2 + 1 for x in xs])


def make_fn(tag: str) -> Callable[..., Any]:
    """A fresh copy of ``_fn`` with its own code object: Dynamo caches per code
    object, so no cell ever sees another cell's cache entries. (The copy keeps
    this file as its source file: torch 2.11 wraps a function whose source file
    it cannot find in a shared ``external_utils.inner`` frame, which would put
    every cell into one code object's cache.)"""
    code = _fn.__code__.replace(co_name=f"fn_{tag}", co_qualname=f"fn_{tag}")
    return types.FunctionType(code, _fn.__globals__, code.co_name)


def make_args(kind: str, k: int, grad: bool, tag: str = "") -> list[torch.Tensor]:
    if kind == "plain":
        args = [torch.randn(SIZE) for _ in range(k)]
    elif kind == "own":
        args = [MeshTensor(torch.randn(SIZE), Mesh(f"{tag}m{i}")) for i in range(k)]
    elif kind == "shared":
        mesh = Mesh(f"{tag}shared")
        args = [MeshTensor(torch.randn(SIZE), mesh) for _ in range(k)]
    elif kind == "tensor-only":
        args = [DataTensor(torch.randn(SIZE)) for _ in range(k)]
    else:
        raise ValueError(kind)
    if grad:
        args = [a.requires_grad_(True) for a in args]
    return args


def _unique_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _data(t: torch.Tensor) -> torch.Tensor:
    return t._data if isinstance(t, (MeshTensor, DataTensor)) else t  # type: ignore[attr-defined,no-any-return]


def check_outputs(kind: str, args: Sequence[torch.Tensor], out: Any) -> None:
    """The outputs of one call: one per argument, right values; for subclass
    kinds ``MeshTensor``s holding the meshes of *these* arguments (by identity)."""
    assert isinstance(out, tuple) and len(out) == len(args), (type(out), len(out))
    for a, o in zip(args, out, strict=True):
        if kind == "plain":
            assert type(o) is torch.Tensor, type(o)
        elif kind == "tensor-only":
            assert type(o) is DataTensor, type(o)
        else:
            assert type(o) is MeshTensor, type(o)
            assert o._mesh is a._mesh, (o._mesh, a._mesh)  # type: ignore[attr-defined]
        torch.testing.assert_close(_data(o).detach(), _data(a).detach() * 2 + 1)


class Cell:
    """One (kind, k): a compiled function and the arguments it is timed with."""

    def __init__(self, kind: str, k: int, backend: str, grad: bool) -> None:
        self.kind, self.k, self.grad = kind, k, grad
        self.fn = torch.compile(make_fn(f"{kind}_k{k}"), backend=backend, fullgraph=True)
        self.args = make_args(kind, k, grad)
        self.n = 0
        self.times: list[float] = []
        self.compile_s = 0.0

    def warm_up(self, calls: int) -> None:
        graphs = _unique_graphs()
        t0 = time.perf_counter()
        out = self.fn(*self.args)
        self.compile_s = time.perf_counter() - t0
        check_outputs(self.kind, self.args, out)
        compiled = _unique_graphs() - graphs
        assert compiled == 1, f"{self.kind} k={self.k}: expected one graph, got {compiled}"
        # Fresh arguments (fresh meshes) must reuse the graph and get their own meshes back.
        for i in range(3):
            fresh = make_args(self.kind, self.k, self.grad, tag=f"fresh{i}-")
            check_outputs(self.kind, fresh, self.fn(*fresh))
        for _ in range(calls):
            self.fn(*self.args)
        recompiled = _unique_graphs() - graphs - 1
        assert recompiled == 0, f"{self.kind} k={self.k}: recompiled {recompiled} time(s) after warm-up"

    def loop(self, n: int) -> float:
        """Seconds for n calls (gc off)."""
        fn, args = self.fn, self.args
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                fn(*args)
            return time.perf_counter() - t0
        finally:
            if gc_was_enabled:
                gc.enable()

    def calibrate(self, target_s: float) -> None:
        n = 1
        while True:
            dt = self.loop(n)
            if dt >= target_s:
                break
            n = max(n * 2, int(n * target_s / max(dt, 1e-9) * 1.1))
        self.n = n

    def run(self) -> None:
        self.times.append(self.loop(self.n) / self.n)

    def stat(self, how: str) -> float:
        return min(self.times) if how == "min" else statistics.median(self.times)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", default="aot_eager", help="torch.compile backend (default aot_eager; e.g. inductor)")
    p.add_argument("--grad", action="store_true", help="inputs require grad (only the forward call is timed)")
    p.add_argument("--ks", default=",".join(map(str, KS)), help="k values, comma-separated (default 1,8,64)")
    p.add_argument(
        "--kinds",
        default="own,shared,tensor-only",
        help="subclass kinds to time: own, shared, tensor-only (default all; plain always runs)",
    )
    p.add_argument("--repeats", type=int, default=15, help="timed loops per cell (default 15)")
    p.add_argument("--target-ms", type=float, default=30.0, help="minimum duration of one loop (default 30 ms)")
    p.add_argument("--warmup", type=int, default=20, help="calls after compiling, before timing (default 20)")
    p.add_argument("--stat", choices=("min", "median"), default="min", help="statistic shown and used for ratios")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument(
        "--check-ratio",
        type=float,
        metavar="X",
        help="exit 1 if any subclass/plain ratio of the own or shared rows exceeds X",
    )
    opts = p.parse_args(argv)

    ks = [int(s) for s in opts.ks.split(",") if s]
    kinds = [s for s in opts.kinds.split(",") if s]
    for kind in kinds:
        if kind not in KINDS[1:]:
            p.error(f"unknown kind {kind!r}; choose from {', '.join(KINDS[1:])}")
    support = opaque_subclass.support()
    print(
        f"torch {torch.__version__}, opaque_subclass mode: {support.mode}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPU(s), torch threads {torch.get_num_threads()}"
    )
    print(
        f"backend {opts.backend}, fullgraph, inputs {'require' if opts.grad else 'do not require'} grad, "
        f"fn: tuple([x * 2 + 1 for x in xs]), args of {SIZE} floats"
    )
    print(
        f"loops >= {opts.target_ms:g} ms, {opts.repeats} repeats round-robin, gc off while timing, "
        f"statistic: {opts.stat}"
    )
    sys.stdout.flush()

    started = time.perf_counter()
    failures: list[str] = []
    cells: list[Cell] = []
    with torch._functorch.config.patch(enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False):
        torch._dynamo.reset()
        for k in ks:
            for kind in ["plain", *kinds]:
                cell = Cell(kind, k, opts.backend, opts.grad)
                try:
                    cell.warm_up(opts.warmup)
                    cell.calibrate(opts.target_ms / 1e3)
                except Exception:  # reported, and the run fails
                    failures.append(f"{kind} k={k}:\n{traceback.format_exc()}")
                    print(f"FAILED {kind} k={k}:\n{traceback.format_exc()}", file=sys.stderr)
                    continue
                cells.append(cell)
        compile_done = time.perf_counter()
        for _ in range(opts.repeats):
            for cell in cells:
                cell.run()
    finished = time.perf_counter()

    by = {(c.kind, c.k): c for c in cells}
    records: list[dict[str, Any]] = []
    print()
    header = f"{'k':>3}  {'kind':<11} {'plain us/call':>14} {'subclass us/call':>17} {'ratio':>6}   {'n/loop':>7} {'compile s':>9}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for k in ks:
        plain = by.get(("plain", k))
        for kind in kinds:
            sub = by.get((kind, k))
            if plain is None or sub is None:
                print(f"{k:>3}  {kind:<11} {'n/a':>14} {'n/a':>17} {'n/a':>6}")
                continue
            ratio = sub.stat(opts.stat) / plain.stat(opts.stat)
            if kind in CHECKED_KINDS:
                worst = max(worst, ratio)
            print(
                f"{k:>3}  {kind:<11} {plain.stat(opts.stat) * 1e6:>14.1f} {sub.stat(opts.stat) * 1e6:>17.1f} "
                f"{ratio:>6.2f}   {sub.n:>7} {sub.compile_s:>9.2f}"
            )
            records.append(
                {
                    "k": k,
                    "kind": kind,
                    "plain_us_min": min(plain.times) * 1e6,
                    "plain_us_median": statistics.median(plain.times) * 1e6,
                    "subclass_us_min": min(sub.times) * 1e6,
                    "subclass_us_median": statistics.median(sub.times) * 1e6,
                    "ratio_min": min(sub.times) / min(plain.times),
                    "ratio_median": statistics.median(sub.times) / statistics.median(plain.times),
                    "plain_n": plain.n,
                    "subclass_n": sub.n,
                    "plain_compile_s": plain.compile_s,
                    "subclass_compile_s": sub.compile_s,
                    "plain_times_us": [t * 1e6 for t in plain.times],
                    "subclass_times_us": [t * 1e6 for t in sub.times],
                }
            )
    print(f"\ncompile + checks + calibration {compile_done - started:.1f} s, timing {finished - compile_done:.1f} s")

    if opts.json:
        payload = {
            "settings": {
                "torch": torch.__version__,
                "mode": support.mode,
                "patched": list(support.patched),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "backend": opts.backend,
                "grad": opts.grad,
                "fn": "tuple([x * 2 + 1 for x in xs])",
                "size": SIZE,
                "ks": ks,
                "kinds": kinds,
                "repeats": opts.repeats,
                "target_ms": opts.target_ms,
                "warmup": opts.warmup,
                "stat": opts.stat,
            },
            "results": records,
            "failures": failures,
            "seconds": finished - started,
        }
        with open(opts.json, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {opts.json}")

    if failures:
        print(f"{len(failures)} cell(s) failed", file=sys.stderr)
        return 1
    if opts.check_ratio is not None and worst > opts.check_ratio:
        print(f"CHECK FAILED: ratio {worst:.2f} > {opts.check_ratio:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
