"""Paired per-call benchmark: a compiled call on subclass inputs against its floor and stock torch.

A compiled call whose inputs are subclasses pays, beyond the graph itself, for
reading each input's leaves and building each output. This benchmark measures
that per call, for k = 1, 8, 64, 512 inputs of a two-attribute subclass with one
opaque (``Sharded(_data, _mesh)``, ``__tensor_flatten__`` -> ``["_data",
"_mesh"], None``), compiled from

    def fn(*xs):
        return [x + 1 for x in xs]

with ``fullgraph=True``, and compares three cells of each configuration in the
same process, timed back to back in every round:

* ``floor``: the hand-written minimum. The same function compiled on the plain
  inner tensors, plus reading each input's leaves (``x._data``, ``x._mesh``)
  and building each output with ``Sharded.__tensor_unflatten__``. With
  backward: the plain graph's gradients, plus reading each tangent's leaves
  and building each gradient with ``__tensor_unflatten__``.
* ``ours``: the compiled call on the subclass inputs, the library enabled.
* ``stock``: the same with the library disabled (``opaque_subclass.disable()``,
  a function compiled while disabled): torch's native path. torch 2.11 cannot
  compile it (no native opaques), so the cell is ``n/a`` there.

Configurations: variant (``own``: every input its own mesh; ``shared``: one mesh
for all inputs; ``nested``: ``Sharded(Sharded(t, a), b)``, two opaques per
input), k, backend (``aot_eager``, ``inductor``) and pass (``fw``: inputs do not
require grad; ``fwbw``: they do, and each call is the forward plus
``torch.autograd.grad(outputs, inputs, tangents)`` with subclass tangents).

Rounds: every round times each cell once (a loop of n calls, n calibrated so a
loop takes ``--target-ms``, the cyclic GC off during the loop). Within a round
the library is enabled for the ``floor``/``ours`` pairs and disabled for the
``floor``/``stock`` pairs (two switches per round, not timed); the order of
the pair alternates between rounds. Each round gives the paired ratios
``ours/floor``, ``stock/floor`` (its own floor loop) and ``ours/stock``; the
table shows their medians and quartiles over the rounds.

Before timing, every cell is checked on fresh inputs with fresh meshes: the
outputs (and gradients) are ``Sharded`` holding the meshes of *that* call by
identity, at every level, with the right values, and no cell compiles again.

Usage::

    python benchmarks/bench_per_call.py                 # every configuration
    python benchmarks/bench_per_call.py --ks 1,8,64 --backends aot_eager --passes fw
    python benchmarks/bench_per_call.py --json out.json --check
    python benchmarks/bench_per_call.py --instructions 20 --ks 8,64   # machine instructions (valgrind)

``--instructions N`` counts, instead of timing, the machine instructions of N
calls of every cell under valgrind's callgrind (the script runs itself under
``valgrind --tool=callgrind --instr-atstart=no`` and switches counting on around
each cell's loop with ``callgrind_control``; an empty loop of N calls, counted
the same way, is subtracted). The counts are the same from run to run, where
times on a shared machine move by several percent; they leave out what
instructions do not show (cache misses, the GPU). valgrind executes no AVX-512
instruction, so inductor's kernels are built for AVX2 there
(``cpp.simdlen = 256``, ``TORCHINDUCTOR_CPP_MARCH=x86-64-v3``).

See benchmarks/README.md ("Per call against the floor") for the columns and
the measured figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    # One cache per process (never shared with another run), set before torch reads it.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_per_call_")

import torch
from torch.utils._pytree import tree_map_only

import opaque_subclass
from opaque_subclass import OpaqueBase

VARIANTS = ("own", "shared", "nested")
PASSES = ("fw", "fwbw")
BACKENDS = ("aot_eager", "inductor")
KS = (1, 8, 64, 512)


class Mesh(OpaqueBase):
    """A reference opaque (identity matters)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Mesh({self.name!r})"


opaque_subclass.register_opaque(Mesh)


class Sharded(torch.Tensor):
    """A wrapper subclass with one tensor and one opaque, written lean so the floor is low."""

    _data: torch.Tensor
    _mesh: Mesh

    @staticmethod
    def __new__(cls, data: torch.Tensor, mesh: Mesh, requires_grad: bool = False) -> Any:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            dtype=data.dtype,
            device=data.device,
            requires_grad=requires_grad,
        )
        r._data = data
        r._mesh = mesh
        return r

    def __init__(self, data: torch.Tensor, mesh: Mesh, requires_grad: bool = False) -> None:
        pass

    def __repr__(self) -> str:
        return f"Sharded(shape={tuple(self.shape)})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_data", "_mesh"], None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(inner["_data"], inner["_mesh"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        mesh = next(a._mesh for a in args if isinstance(a, Sharded))
        out = func(*tree_map_only(Sharded, lambda t: t._data, args), **(kwargs or {}))
        return tree_map_only(torch.Tensor, lambda t: Sharded(t, mesh), out)


def _fresh_fn() -> Callable[..., Any]:
    """The benchmarked function, a new code object per cell (its own Dynamo cache)."""
    namespace: dict[str, Any] = {}
    source = "def fn(*xs):\n    return [x + 1 for x in xs]\n"
    exec(compile(source, __file__, "exec"), namespace)
    return namespace["fn"]  # type: ignore[no-any-return]


@dataclasses.dataclass
class Inputs:
    """One call's inputs: subclass arguments, tangents, and the plain leaves the floor reads."""

    args: list[torch.Tensor]
    tangents: list[torch.Tensor]


def _make(variant: str, k: int, grad: bool, tag: str) -> Inputs:
    shared = Mesh(f"{tag}-shared")
    args: list[torch.Tensor] = []
    tangents: list[torch.Tensor] = []
    for i in range(k):
        mesh = shared if variant == "shared" else Mesh(f"{tag}-{i}")
        data = torch.randn(16)
        if variant == "nested":
            outer = Mesh(f"{tag}-{i}-outer")
            args.append(Sharded(Sharded(data, mesh), outer, requires_grad=grad))
            tangents.append(Sharded(Sharded(torch.ones(16), mesh), outer))
        else:
            args.append(Sharded(data, mesh, requires_grad=grad))
            tangents.append(Sharded(torch.ones(16), mesh))
    return Inputs(args, tangents)


def _leaves(x: Any) -> list[Any]:
    """What a subclass input holds, at every level (for the checks)."""
    if isinstance(x, Sharded):
        return [*_leaves(x._data), x._mesh]
    return [x]


@dataclasses.dataclass
class Config:
    variant: str
    k: int
    backend: str
    passname: str

    @property
    def label(self) -> str:
        return f"{self.variant:6s} k={self.k:<4d} {self.backend:9s} {self.passname}"


@dataclasses.dataclass
class Cell:
    name: str
    run: Callable[[], Any]
    n: int = 1
    times: list[float] = dataclasses.field(default_factory=list)


def _floor_cells(config: Config, inputs: Inputs) -> Callable[[], Any]:
    """The hand-written minimum: plain graph, leaves read, outputs built by ``__tensor_unflatten__``."""
    compiled = torch.compile(_fresh_fn(), backend=config.backend, fullgraph=True)
    grad = config.passname == "fwbw"
    unflatten = Sharded.__tensor_unflatten__
    args, tangents = inputs.args, inputs.tangents
    read: Callable[[list[Any]], tuple[list[Any], Any]]
    build: Callable[[Sequence[Any], Any], list[Any]]

    if config.variant == "nested":

        def read(xs: list[Any]) -> tuple[list[Any], Any]:
            """Every leaf of every argument, as an unwrap reads them: the data and the meshes."""
            inner = [x._data for x in xs]
            outer = [x._mesh for x in xs]
            return [y._data for y in inner], ([y._mesh for y in inner], outer)

        def build(values: Sequence[Any], meshes: Any) -> list[Any]:
            return [
                unflatten(
                    {"_data": unflatten({"_data": v, "_mesh": m}, None, None, None), "_mesh": mo}, None, None, None
                )
                for v, m, mo in zip(values, *meshes, strict=True)
            ]

    else:

        def read(xs: list[Any]) -> tuple[list[Any], Any]:
            return [x._data for x in xs], [x._mesh for x in xs]

        def build(values: Sequence[Any], meshes: Any) -> list[Any]:
            return [unflatten({"_data": v, "_mesh": m}, None, None, None) for v, m in zip(values, meshes, strict=True)]

    # The floor's own plain leaves (the graph takes these): tensors that require grad exactly
    # when the subclass inputs do.
    plain = [d.detach().requires_grad_(grad) for d in read(args)[0]]

    if not grad:

        def floor() -> Any:
            meshes = read(args)[1]
            return build(compiled(*plain), meshes)

        return floor

    def floor_bw() -> Any:
        meshes = read(args)[1]
        outs = compiled(*plain)
        wrapped = build(outs, meshes)
        t_datas, t_meshes = read(tangents)
        return wrapped, build(torch.autograd.grad(outs, plain, t_datas), t_meshes)

    return floor_bw


def _subclass_cell(config: Config, inputs: Inputs) -> tuple[Callable[[], Any], Callable[[Inputs], Any]]:
    """The compiled call on subclass inputs (ours or stock: whichever state compiles it)."""
    compiled = torch.compile(_fresh_fn(), backend=config.backend, fullgraph=True)
    args = inputs.args
    tangents = inputs.tangents

    def call_with(given: Inputs) -> Any:
        outs = compiled(*given.args)
        if config.passname == "fwbw":
            return outs, torch.autograd.grad(outs, given.args, given.tangents)
        return outs, None

    if config.passname == "fwbw":

        def run_bw() -> Any:
            outs = compiled(*args)
            return outs, torch.autograd.grad(outs, args, tangents)

        return run_bw, call_with

    def run() -> Any:
        return compiled(*args)

    return run, call_with


class CheckFailed(AssertionError):
    pass


def _check(config: Config, call_with: Callable[[Inputs], Any], frames: Callable[[], int]) -> None:
    """Fresh inputs, fresh meshes: outputs and gradients hold *that* call's meshes, right values, no recompile."""
    grad = config.passname == "fwbw"
    before = frames()
    for attempt in range(3):
        given = _make(config.variant, config.k, grad, f"check{attempt}")
        outs, grads = call_with(given)
        if len(outs) != config.k:
            raise CheckFailed(f"{config.label}: {len(outs)} outputs for {config.k} inputs")
        for x, out in zip(given.args, outs, strict=True):
            if type(out) is not Sharded:
                raise CheckFailed(f"{config.label}: output is {type(out).__name__}")
            want, got = _leaves(x), _leaves(out)
            if any(a is not b for a, b in zip(want[1:], got[1:], strict=True)):
                raise CheckFailed(f"{config.label}: an output holds another call's mesh")
            if not torch.equal(got[0], want[0].detach() + 1):
                raise CheckFailed(f"{config.label}: wrong output values")
        if grads is not None:
            for t, g in zip(given.tangents, grads, strict=True):
                if type(g) is not Sharded:
                    raise CheckFailed(f"{config.label}: gradient is {type(g).__name__}")
                want, got = _leaves(t), _leaves(g)
                if not torch.equal(got[0], want[0]):
                    raise CheckFailed(f"{config.label}: wrong gradient values")
    if frames() != before:
        raise CheckFailed(f"{config.label}: compiled again on fresh inputs ({frames() - before} frames)")


def _frames() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _loop(cell: Cell) -> float:
    run, n = cell.run, cell.n
    gc_was = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - start) / n
    finally:
        if gc_was:
            gc.enable()


def _calibrate(cell: Cell, target_s: float) -> None:
    per = _loop(cell)
    cell.n = max(1, int(target_s / max(per, 1e-7)))


@dataclasses.dataclass
class Row:
    config: Config
    floor_a: Cell
    ours: Cell
    floor_b: Cell | None
    stock: Cell | None
    compile_s: dict[str, float]
    error: str | None = None

    def ratios(self, which: str) -> list[float]:
        if which == "ours/floor":
            return [o / f for o, f in zip(self.ours.times, self.floor_a.times, strict=True)]
        assert self.floor_b is not None and self.stock is not None
        if which == "stock/floor":
            return [s / f for s, f in zip(self.stock.times, self.floor_b.times, strict=True)]
        return [
            (o / fa) / (s / fb)
            for o, fa, s, fb in zip(
                self.ours.times, self.floor_a.times, self.stock.times, self.floor_b.times, strict=True
            )
        ]


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        v = values[0]
        return v, v, v
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _has_stock() -> bool:
    """Whether torch compiles opaque attributes natively (2.12+)."""
    return opaque_subclass.support().mode != "backport"


def build(config: Config, stock: bool) -> Row:
    grad = config.passname == "fwbw"
    inputs = _make(config.variant, config.k, grad, "bench")
    compile_s: dict[str, float] = {}

    def timed_first(name: str, fn: Callable[[], Any]) -> None:
        start = time.perf_counter()
        fn()
        compile_s[name] = time.perf_counter() - start

    floor = Cell("floor", _floor_cells(config, inputs))
    timed_first("floor", floor.run)
    run, call_with = _subclass_cell(config, inputs)
    ours = Cell("ours", run)
    timed_first("ours", ours.run)
    _check(config, call_with, _frames)
    floor_b = stock_cell = None
    if stock:
        opaque_subclass.disable()
        try:
            run_s, call_with_s = _subclass_cell(config, inputs)
            stock_cell = Cell("stock", run_s)
            timed_first("stock", stock_cell.run)
            _check(config, call_with_s, _frames)
        finally:
            opaque_subclass.enable()
        floor_b = Cell("floor", floor.run)
    return Row(config, floor, ours, floor_b, stock_cell, compile_s)


def measure(rows: list[Row], rounds: int, target_s: float, warmup: int) -> None:
    """Calibrate, then time every pair once per round (library enabled, then disabled)."""
    for row in rows:
        for cell in (row.floor_a, row.ours):
            for _ in range(warmup):
                cell.run()
            _calibrate(cell, target_s)
    stock_rows = [r for r in rows if r.stock is not None]
    if stock_rows:
        opaque_subclass.disable()
        try:
            for row in stock_rows:
                assert row.stock is not None and row.floor_b is not None
                for _ in range(warmup):
                    row.stock.run()
                _calibrate(row.stock, target_s)
                row.floor_b.n = row.floor_a.n
        finally:
            opaque_subclass.enable()
    for index in range(rounds):
        flip = index % 2 == 1
        for row in rows:
            pair = (row.ours, row.floor_a) if flip else (row.floor_a, row.ours)
            for cell in pair:
                cell.times.append(_loop(cell))
        if stock_rows:
            opaque_subclass.disable()
            try:
                for row in stock_rows:
                    assert row.stock is not None and row.floor_b is not None
                    pair = (row.stock, row.floor_b) if flip else (row.floor_b, row.stock)
                    for cell in pair:
                        cell.times.append(_loop(cell))
            finally:
                opaque_subclass.enable()


# --instructions: the script under callgrind (the parent re-runs itself there; the child counts)
_CALLGRIND_DIR = "OSC_BENCH_CALLGRIND_DIR"


def _under_callgrind(argv: Sequence[str]) -> int:
    """Run this script with ``argv`` under callgrind, counting nothing until a cell's loop."""
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"--instructions needs valgrind's callgrind: {', '.join(missing)} not found", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench_per_call_cg_") as out:
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.%p.out",
            sys.executable, os.path.abspath(__file__), *argv,
        ]  # fmt: skip
        env = dict(os.environ, **{_CALLGRIND_DIR: out})
        # valgrind executes no AVX-512 instruction: inductor's kernels for AVX2 (torch 2.13+ read
        # the architecture from this variable; the vector width is set in the child)
        env.setdefault("TORCHINDUCTOR_CPP_MARCH", "x86-64-v3")
        return subprocess.run(command, env=env, check=False).returncode


class _Counter:
    """Machine instructions of a loop, read from the dump callgrind writes when asked."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.pid = str(os.getpid())
        self.dumps = 0
        self._control("--instr=on")

    def _control(self, *args: str) -> None:
        done = subprocess.run(["callgrind_control", *args, self.pid], capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"callgrind_control {' '.join(args)} failed: {done.stdout}{done.stderr}")

    def count(self, run: Callable[[], Any], n: int) -> int:
        self._control("--zero")
        gc_was = gc.isenabled()
        gc.disable()
        try:
            for _ in range(n):
                run()
        finally:
            if gc_was:
                gc.enable()
        self._control("--dump")
        self.dumps += 1
        path = os.path.join(self.directory, f"cg.{self.pid}.out.{self.dumps}")
        with open(path) as fh:
            for line in fh:
                if line.startswith("summary:") or line.startswith("totals:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no instruction total in {path}")


def measure_instructions(rows: list[Row], n: int, rounds: int, warmup: int) -> None:
    """Per call, the instructions of each cell's loop of ``n`` calls less an empty loop's, per
    round; each count follows ``warmup`` uncounted calls of its cell (the library switched off
    and on between cells clears torch's caches the first calls refill)."""
    counter = _Counter(os.environ[_CALLGRIND_DIR])

    def per_call(cell: Cell) -> float:
        for _ in range(warmup):
            cell.run()
        cell.n = n
        empty = counter.count(_nothing, n)
        return (counter.count(cell.run, n) - empty) / n

    for _ in range(rounds):
        for row in rows:
            for cell in (row.floor_a, row.ours):
                cell.times.append(per_call(cell))
            if row.stock is not None and row.floor_b is not None:
                opaque_subclass.disable()
                try:
                    for cell in (row.floor_b, row.stock):
                        cell.times.append(per_call(cell))
                finally:
                    opaque_subclass.enable()


def _nothing() -> None:
    return None


def _fmt(q: tuple[float, float, float]) -> str:
    return f"{q[1]:.3f} [{q[0]:.3f}-{q[2]:.3f}]"


def report(rows: list[Row], instructions: bool = False) -> str:
    unit = "ki" if instructions else "us"  # thousands of instructions, or microseconds, per call
    scale = 1e-3 if instructions else 1e6
    lines = [
        f"torch {torch.__version__}, library mode {opaque_subclass.support().mode}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads",
        "machine instructions per call (callgrind), in thousands (ki)"
        if instructions
        else "ratios: median [first quartile - third quartile] of the per-round paired ratios",
        "",
        f"| {'variant':6s} | {'k':>4s} | {'backend':9s} | pass | floor {unit} | ours {unit} | ours/floor | stock/floor | ours/stock |",
        "| --- | ---: | --- | --- | ---: | ---: | --- | --- | --- |",
    ]
    for row in rows:
        c = row.config
        if row.error:
            lines.append(f"| {c.variant} | {c.k} | {c.backend} | {c.passname} | failed: {row.error} |")
            continue
        floor_us = statistics.median(row.floor_a.times) * scale
        ours_us = statistics.median(row.ours.times) * scale
        of = _fmt(_quartiles(row.ratios("ours/floor")))
        if row.stock is not None:
            sf = _fmt(_quartiles(row.ratios("stock/floor")))
            os_ = _fmt(_quartiles(row.ratios("ours/stock")))
        else:
            sf = os_ = "n/a"
        lines.append(
            f"| {c.variant:6s} | {c.k:>4d} | {c.backend:9s} | {c.passname:4s} | {floor_us:8.1f} | {ours_us:7.1f} | {of} | {sf} | {os_} |"
        )
    return "\n".join(lines)


def bounds_failures(rows: list[Row], slack: float) -> list[str]:
    """The issue's bounds on the medians: ours/floor <= 1.05 at k >= 64, <= 1.02 at k <= 8, ours/stock <= 1."""
    failures = []
    for row in rows:
        if row.error:
            failures.append(f"{row.config.label}: {row.error}")
            continue
        limit = 1.05 if row.config.k >= 64 else 1.02
        median = _quartiles(row.ratios("ours/floor"))[1]
        if median > limit + slack:
            failures.append(f"{row.config.label}: ours/floor {median:.3f} > {limit:.2f}")
        if row.stock is not None:
            versus = _quartiles(row.ratios("ours/stock"))[1]
            if versus > 1.0 + slack:
                failures.append(f"{row.config.label}: ours/stock {versus:.3f} > 1.00")
    return failures


def _record(row: Row) -> dict[str, Any]:
    out: dict[str, Any] = {
        "variant": row.config.variant,
        "k": row.config.k,
        "backend": row.config.backend,
        "pass": row.config.passname,
        "error": row.error,
        "compile_s": row.compile_s,
    }
    if row.error is None:
        for cell in (row.floor_a, row.ours, row.stock):
            if cell is not None:
                out[f"{cell.name}_s"] = cell.times
                out[f"{cell.name}_n"] = cell.n
        for which in ("ours/floor", "stock/floor", "ours/stock"):
            if which == "ours/floor" or row.stock is not None:
                q = _quartiles(row.ratios(which))
                out[which] = {"q1": q[0], "median": q[1], "q3": q[2]}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", default=",".join(map(str, KS)))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--passes", default=",".join(PASSES))
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--target-ms", type=float, default=20.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-stock", action="store_true", help="leave out the stock cells")
    parser.add_argument("--json", help="write every round's times and the ratios here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a median breaks the issue's bounds")
    parser.add_argument("--slack", type=float, default=0.0, help="added to every bound by --check")
    parser.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="count machine instructions of N calls per cell under valgrind's callgrind instead of timing",
    )
    opts = parser.parse_args(argv)
    if opts.instructions is not None and _CALLGRIND_DIR not in os.environ:
        return _under_callgrind(sys.argv[1:] if argv is None else list(argv))
    started = time.perf_counter()
    if opts.instructions is not None and "inductor" in opts.backends.split(","):
        import torch._inductor.config as inductor_config

        inductor_config.cpp.simdlen = 256  # AVX2 kernels (see _under_callgrind)
    stock = _has_stock() and not opts.no_stock
    configs = [
        Config(v, int(k), b, p)
        for b in opts.backends.split(",")
        for p in opts.passes.split(",")
        for v in opts.variants.split(",")
        for k in opts.ks.split(",")
    ]
    for name in (c.variant for c in configs):
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    rows: list[Row] = []
    for config in configs:
        try:
            rows.append(build(config, stock))
        except CheckFailed as exc:
            empty = Cell("floor", lambda: None)
            rows.append(Row(config, empty, empty, None, None, {}, error=str(exc)))
        print(f"compiled {config.label}: {rows[-1].compile_s or rows[-1].error}", file=sys.stderr, flush=True)
    measured = [r for r in rows if r.error is None]
    if opts.instructions is not None:
        opts.rounds = min(opts.rounds, 2)  # deterministic counts: a second round shows they repeat
        measure_instructions(measured, opts.instructions, opts.rounds, opts.warmup)
    else:
        measure(measured, opts.rounds, opts.target_ms / 1000, opts.warmup)
    print(report(rows, instructions=opts.instructions is not None))
    elapsed = time.perf_counter() - started
    print(f"\n{len(rows)} configurations, {opts.rounds} rounds, {elapsed:.0f} s")
    failures = bounds_failures(rows, opts.slack)
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(
                {
                    "torch": torch.__version__,
                    "mode": opaque_subclass.support().mode,
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "threads": torch.get_num_threads(),
                    "rounds": opts.rounds,
                    "target_ms": opts.target_ms,
                    "unit": "instructions" if opts.instructions is not None else "seconds",
                    "calls_per_count": opts.instructions,
                    "rows": [_record(r) for r in rows],
                    "bounds_failures": failures,
                    "seconds": elapsed,
                },
                fh,
                indent=1,
            )
    if opts.check and failures:
        print("\nbounds not met:\n  " + "\n  ".join(failures))
        return 1
    return 0 if all(r.error is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
