"""Cost of the input checks that name a bad subclass attribute, on compile time.

On every supported torch the library checks each subclass input where torch
first meets it while tracing, at two points:

* Dynamo's ``VariableBuilder.wrap_tensor`` (on torch 2.11 part of the
  backport, on 2.12+ a diagnostic fix): every level's attributes, that
  ``__tensor_unflatten__`` rebuilds it, and that every level's flatten context
  equals its deep copy (``opaque_subclass.core.flatten.check_guardable_context``,
  what Dynamo's guard on the context needs);
* torch's ``torch._subclasses.fake_tensor.get_plain_tensors`` (a diagnostic fix
  on every release): torch's walk runs inside a ``try`` block, and the library
  walks the input only if torch's raises.

Both run while tracing, never on a compiled call. This script measures what
they add to a compilation: ``torch.compile(fn, backend=BACKEND, fullgraph=True)`` of

    def fn(*xs):
        return tuple(x * 2 + 1 for x in xs)

with k nested ``MeshTensor`` arguments (two levels, one mesh per level), timed
from the first call to its return (Dynamo + AOTAutograd + the backend) after
``torch._dynamo.reset()``, ``--repeats`` times in each of three variants:

* ``on``: the library as installed;
* ``off``: both patched functions suspended (torch's originals restored; the
  rest of the library unchanged);
* ``forward``: suspended, and torch's ``wrap_tensor`` behind a wrapper that
  only forwards to it: the patch's extra Python frame without its checks.

Two flatten contexts (``--contexts``):

* ``trivial``: the test suite's ``nested(2)``, whose context is
  ``("lvl", level)``: ``copy.deepcopy`` returns such a tuple of atoms itself,
  so the context check costs next to nothing there;
* ``realistic``: the same ``MeshTensor`` levels with the kind of context a
  quantized tensor carries: ``{"config": QuantConfig(...), "block_size": (1, 32),
  "orig_dtype": torch.float32}``, ``QuantConfig`` a frozen dataclass (value
  equality), one new config per level. Deep-copying it is real work.

Each round runs every context's three variants back to back, the order of
contexts and of variants rotating from round to round, so drift of the
machine hits them alike; before each timed compilation the patched
functions are suspended and restored (the same work before every variant:
suspending scans torch's modules, and in one probe that alone made the next
compilation about 1% faster) and ``gc.collect()`` runs. Printed per context:

* the median compile time of each variant (wall clock);
* ``on / off`` as the ratio of the medians, with a 95% bootstrap interval
  (2,000 resamples of each side), and *paired*: the median over rounds of
  ``on_i / off_i``, with a 95% bootstrap interval over rounds. On a machine
  whose speed drifts (a shared virtual machine: the same pure-Python loop
  can take 1.7x as long from one second to the next), pairing compilations
  that ran back to back cancels most of the drift the ratio of medians keeps;
* ``forward / off``, paired: what the Python frame alone adds;
* the checks timed *in situ*, inside real compilations (five more, not the
  timed ones; median): the seconds spent in the patched ``wrap_tensor``'s
  ``validate_graph_input`` (the walk with ``guarded=True``, once per level and graph) and, within it, in
  ``check_guardable_context``, with their call counts, and that time's share
  of the compilation with the checks suspended: the checks' own cost;
* ``check_guardable_context`` timed directly per level in a loop (warm
  caches, so lower than in situ), in microseconds;
* the ``get_plain_tensors`` fix against torch's original per call on one
  argument (timed directly), with how many times one compilation calls it
  (counted with ``sys.setprofile`` in one more compilation);
* how many times that compilation walks the interpreter's stack
  (``sys._getframe``, the ``traceback``/``inspect`` stack extractors, torch's
  ``CapturedTraceback.extract``) while the patched ``wrap_tensor`` runs and
  elsewhere: only a walk made under it can see the frame it adds.

The per-call cost is zero by construction (the checks are not in the
compiled call's path); ``--calls N`` also times N compiled calls with the
checks on and suspended while compiling, in alternating blocks, each block
after its own compilation, to show it.

Usage::

    python benchmarks/bench_compile_checks.py [--backend aot_eager] [--k 8] [--repeats 15]
        [--contexts trivial,realistic] [--calls 0]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import inspect
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch._dynamo.exc
import torch.utils._traceback
from torch._dynamo.variables.builder import VariableBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from subclasses import Mesh, MeshTensor, nested

import opaque_subclass
from opaque_subclass import activation
from opaque_subclass.core import checks
from opaque_subclass.core.checks import check_guardable_context
from opaque_subclass.core.walk import Level, walk

WRAP_TENSOR = "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor"
PLAIN_TENSORS = "torch._subclasses.fake_tensor.get_plain_tensors"


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """A small config object compared by value, as a quantized tensor's context holds."""

    bits: int
    group_size: int
    symmetric: bool
    scheme: str


def quantized(depth: int = 2) -> torch.Tensor:
    """``nested(depth)`` with a realistic flatten context at each level."""
    t: torch.Tensor = torch.arange(6.0).reshape(2, 3)
    for level in range(depth):
        ctx = {
            "config": QuantConfig(bits=4 if level == 0 else 8, group_size=32, symmetric=False, scheme="affine"),
            "block_size": (1, 32),
            "orig_dtype": torch.float32,
        }
        t = MeshTensor(t, Mesh(f"q{level}"), ctx=ctx)
    return t


MAKERS: dict[str, Callable[[], torch.Tensor]] = {"trivial": lambda: nested(2), "realistic": quantized}


def _patched() -> list[tuple[Any, str, str]]:
    """``(patch set, target, 'patch'|'fix')`` for each checked target this torch patches."""
    found = []
    for target in (WRAP_TENSOR, PLAIN_TENSORS):
        for ps, kind in ((activation.BACKPORT, "patch"), (activation.FIXES, "fix")):
            if ps is not None and target in ps.targets:
                found.append((ps, target, kind))
                break
    if not any(t == WRAP_TENSOR for _, t, _ in found):
        raise SystemExit(f"{WRAP_TENSOR} is not patched on torch {torch.__version__}: nothing to measure")
    return found


@contextlib.contextmanager
def _suspended(patched: list[tuple[Any, str, str]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for ps, target, _ in patched:
            stack.enter_context(ps.suspended(target))
        yield


def _compile_once(make: Callable[[], torch.Tensor], k: int, backend: str) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one compilation (the first call)."""
    torch._dynamo.reset()
    xs: list[Any] = [make() for _ in range(k)]
    fn = torch.compile(lambda *xs: tuple(x * 2 + 1 for x in xs), backend=backend, fullgraph=True)
    gc.collect()  # every compilation starts from the same collector state
    c0, t0 = time.process_time(), time.perf_counter()
    out: Any = fn(*xs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert all(o._mesh is x._mesh for o, x in zip(out, xs, strict=True))
    return wall, cpu


VARIANTS = ("on", "forward", "off")


def _compile_variant(
    variant: str, patched: list[tuple[Any, str, str]], make: Callable[[], torch.Tensor], k: int, backend: str
) -> tuple[float, float]:
    """One timed compilation with the checks ``on``, ``off`` (torch's originals
    restored) or with torch's ``wrap_tensor`` behind a ``forward``-only wrapper
    (the patch's extra Python frame, without its checks). The same switching
    work (suspend, restore) runs before each."""
    if variant == "on":
        with _suspended(patched):
            pass
        return _compile_once(make, k, backend)
    with _suspended(patched):
        if variant == "off":
            return _compile_once(make, k, backend)
        original = VariableBuilder.__dict__["wrap_tensor"]

        def wrap_tensor(self: Any, value: Any) -> Any:
            return original(self, value)

        VariableBuilder.wrap_tensor = wrap_tensor  # type: ignore[method-assign]  # restored below
        try:
            return _compile_once(make, k, backend)
        finally:
            VariableBuilder.wrap_tensor = original  # type: ignore[method-assign]


def _calls(
    patched: list[tuple[Any, str, str]], make: Callable[[], torch.Tensor], k: int, backend: str, n: int
) -> tuple[float, float]:
    """Seconds per compiled call with the checks on and suspended while
    compiling: 20 blocks of ``n // 20`` calls, alternating, each after its own
    ``torch._dynamo.reset()`` and compilation (so both are timed on a cache
    holding only their own graph); the median block of each."""
    block = max(1, n // 20)
    blocks: tuple[list[float], list[float]] = ([], [])
    for i in range(20):
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            torch._dynamo.reset()
            xs = [make() for _ in range(k)]
            fn = torch.compile(lambda *xs: tuple(x * 2 + 1 for x in xs), backend=backend, fullgraph=True)
            with contextlib.nullcontext() if j == 0 else _suspended(patched):
                fn(*xs)
            t0 = time.perf_counter()
            for _ in range(block):
                fn(*xs)
            blocks[j].append((time.perf_counter() - t0) / block)
    return statistics.median(blocks[0]), statistics.median(blocks[1])


@contextlib.contextmanager
def _timed(namespace: dict[str, Any], name: str, acc: list[float]) -> Iterator[None]:
    """Replace ``namespace[name]`` by a wrapper adding its seconds to ``acc[0]``
    and its calls to ``acc[1]``."""
    original = namespace[name]

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            acc[0] += time.perf_counter() - t0
            acc[1] += 1

    namespace[name] = timed
    try:
        yield
    finally:
        namespace[name] = original


def _in_situ(make: Callable[[], torch.Tensor], k: int, backend: str, n: int = 5) -> dict[str, tuple[float, int]]:
    """The checks timed inside real compilations (not the timed ones): seconds
    and calls per compilation (median of ``n``) of the ``wrap_tensor`` check
    (``validate_graph_input`` as the patched ``wrap_tensor`` calls it) and of
    ``check_guardable_context`` within it; and calls of ``get_plain_tensors``."""
    replacement = VariableBuilder.wrap_tensor  # the library's, which looks up validate_graph_input in its module
    if "validate_graph_input" not in replacement.__globals__:
        raise SystemExit(f"{WRAP_TENSOR} does not call validate_graph_input on torch {torch.__version__}")
    plain_code = getattr(torch._subclasses.fake_tensor.get_plain_tensors, "__code__", None)
    plain_calls = 0
    wrap_code, inside = replacement.__code__, 0
    walkers, c_functions = _stack_walkers()
    c_walkers = {id(f) for f in c_functions}
    walks = {True: 0, False: 0}  # stack walks while the patched wrap_tensor runs / elsewhere

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal plain_calls, inside
        if event == "call":
            code = frame.f_code
            if code is plain_code:
                plain_calls += 1
            elif code is wrap_code:
                inside += 1
            elif code in walkers:
                walks[inside > 0] += 1
        elif event == "return" and frame.f_code is wrap_code:
            inside -= 1
        elif event == "c_call" and id(arg) in c_walkers:  # no generator here: Dynamo would trace it
            walks[inside > 0] += 1

    sys.setprofile(profile)  # counted in a compilation of its own: profiling slows it down
    try:
        _compile_once(make, k, backend)
    finally:
        sys.setprofile(None)
    runs: dict[str, list[tuple[float, int]]] = {"wrap_tensor check": [], "check_guardable_context": []}
    for _ in range(n):
        check, context = [0.0, 0], [0.0, 0]
        with (
            _timed(replacement.__globals__, "validate_graph_input", check),
            _timed(vars(checks), "check_guardable_context", context),
        ):
            _compile_once(make, k, backend)
        runs["wrap_tensor check"].append((check[0], int(check[1])))
        runs["check_guardable_context"].append((context[0], int(context[1])))
    out = {key: (statistics.median(t for t, _ in v), v[0][1]) for key, v in runs.items()}
    out["get_plain_tensors"] = (float("nan"), plain_calls)
    out["stack walks in wrap_tensor"] = (float("nan"), walks[True])
    out["stack walks elsewhere"] = (float("nan"), walks[False])
    return out


def _stack_walkers() -> tuple[set[Any], tuple[Any, ...]]:
    """The code objects of the Python functions that walk the interpreter's
    stack (the standard library's and torch's), and the C functions that do."""
    functions: list[Any] = [
        traceback.walk_stack,
        traceback.extract_stack,
        traceback.StackSummary.extract,
        inspect.stack,
        inspect.getouterframes,
        torch.utils._traceback.CapturedTraceback.extract,
        getattr(torch._dynamo.exc, "_extract_stack_with_positions", None),  # torch 2.14+
    ]
    codes = {getattr(f, "__func__", f).__code__ for f in functions if f is not None}
    c_functions = (sys._getframe, getattr(torch._C._profiler, "gather_traceback", sys._getframe))
    return codes, c_functions


def _ratio_interval(on: list[float], off: list[float], resamples: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of ``median(on) / median(off)``."""
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(on, k=len(on))) / statistics.median(rng.choices(off, k=len(off)))
        for _ in range(resamples)
    )
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def _paired(on: list[float], off: list[float], resamples: int = 2000) -> tuple[float, tuple[float, float]]:
    """The median of the per-round ratios ``on[i] / off[i]`` and its 95%
    bootstrap interval (rounds resampled). Pairing cells that ran back to back
    cancels the machine's slow drift, which the ratio of medians keeps."""
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return statistics.median(ratios), (boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1])


def _shown(ratio: float, interval: tuple[float, float]) -> str:
    return f"{ratio:.4f} ({interval[0]:.3f}-{interval[1]:.3f})"


def _per_call(f: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``f``: the best of 5 loops of ``n`` calls."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--k", type=int, default=8, help="subclass arguments (default 8)")
    parser.add_argument("--repeats", type=int, default=15, help="compilations per cell (default 15)")
    parser.add_argument("--contexts", default="trivial,realistic", help="flatten contexts (default both)")
    parser.add_argument("--calls", type=int, default=0, help="also time this many compiled calls per setting")
    args = parser.parse_args()
    contexts = [c.strip() for c in args.contexts.split(",") if c.strip()]
    unknown = [c for c in contexts if c not in MAKERS]
    if unknown or not contexts:
        parser.error(f"--contexts: choose from {', '.join(MAKERS)} (got {args.contexts!r})")
    patched = _patched()

    for c in contexts:  # warm-up: imports, first-compile costs
        _compile_once(MAKERS[c], args.k, args.backend)
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(c, v): [] for c in contexts for v in VARIANTS}
    for i in range(args.repeats):
        # rotate the order of contexts and of variants every round, so drift hits
        # every cell alike, and the three variants of one context run back to back
        for c in contexts[i % len(contexts) :] + contexts[: i % len(contexts)]:
            for v in VARIANTS[i % 3 :] + VARIANTS[: i % 3]:
                times[c, v].append(_compile_variant(v, patched, MAKERS[c], args.k, args.backend))

    print(
        f"torch {torch.__version__}, opaque_subclass {opaque_subclass.__version__} ({opaque_subclass.support().mode}), "
        f"backend {args.backend}, k={args.k} nested MeshTensor arguments (2 levels), "
        f"{args.repeats} compilations per cell"
    )
    print(
        "suspended for 'off' and 'forward': "
        + ", ".join(f"{t.rsplit('.', 2)[-2]}.{t.rsplit('.', 1)[-1]} ({kind})" for _, t, kind in patched)
    )
    print()
    print("compile time, median ms (wall clock): checks on / a wrapper that only forwards / checks suspended")
    print("ratios to 'suspended' (target <= 1.02 for 'on'), 95% bootstrap intervals:")
    print("  of medians: median(on) / median(off)")
    print("  paired:     median over rounds of on_i / off_i (the cells of a round run back to back)")
    print()
    print(
        f"{'context':<10} | {'on':>6} | {'forward':>7} | {'off':>6} | {'on/off of medians':>24} | "
        f"{'on/off paired':>24} | {'forward/off paired':>24} | {'wrap_tensor check in situ':>25} | share"
    )
    situ = {c: _in_situ(MAKERS[c], args.k, args.backend) for c in contexts}
    for c in contexts:
        walls = {v: [w for w, _ in times[c, v]] for v in VARIANTS}
        med = {v: statistics.median(walls[v]) for v in VARIANTS}
        t, n = situ[c]["wrap_tensor check"]
        cols = [
            _shown(med["on"] / med["off"], _ratio_interval(walls["on"], walls["off"])),
            _shown(*_paired(walls["on"], walls["off"])),
            _shown(*_paired(walls["forward"], walls["off"])),
        ]
        print(
            f"{c:<10} | {med['on'] * 1e3:6.1f} | {med['forward'] * 1e3:7.1f} | {med['off'] * 1e3:6.1f} | "
            + " | ".join(f"{col:>24}" for col in cols)
            + f" | {f'{t * 1e6:.0f} us ({n} calls)':>25} | {t / med['off'] * 100:.3f}%"
        )

    print()
    print("check_guardable_context alone: per level timed directly (best of 5 loops), and in situ per compilation:")
    for c in contexts:
        levels = [
            slot for x in (MAKERS[c]() for _ in range(args.k)) for _, slot in walk(x, "x") if isinstance(slot, Level)
        ]

        def check_levels(levels: list[Level] = levels) -> None:
            for level in levels:
                check_guardable_context(level)

        per_level = _per_call(check_levels, 500) / len(levels)
        t, n = situ[c]["check_guardable_context"]
        m_off = statistics.median(w for w, _ in times[c, "off"])
        print(
            f"  {c:<10}: {per_level * 1e6:6.2f} us per level directly; in situ {n} levels, {t * 1e6:.0f} us "
            f"({t / n * 1e6:.2f} us per level, {t / m_off * 100:.3f}% of the compilation)"
        )

    if any(t == PLAIN_TENSORS for _, t, _ in patched):
        fake_tensor = torch._subclasses.fake_tensor
        x = MAKERS[contexts[0]]()

        def plain_tensors() -> None:
            fake_tensor.get_plain_tensors(x, out=[])

        fixed = _per_call(plain_tensors, 5000)
        with _suspended([p for p in patched if p[1] == PLAIN_TENSORS]):
            original = _per_call(plain_tensors, 5000)
        n = situ[contexts[0]]["get_plain_tensors"][1]
        print(
            f"get_plain_tensors on one argument ({contexts[0]}): {fixed * 1e6:.2f} us with the fix, "
            f"{original * 1e6:.2f} us torch's ({(fixed - original) * 1e6:+.2f} us); {n} calls per compilation"
        )

    inside, elsewhere = (situ[contexts[0]][f"stack walks {where}"][1] for where in ("in wrap_tensor", "elsewhere"))
    print(
        f"stack walks in one compilation ({contexts[0]}; sys._getframe, traceback/inspect stack extraction, "
        f"torch's CapturedTraceback): {inside} while the patched wrap_tensor runs, {elsewhere} elsewhere"
    )

    if args.calls:
        print()
        for c in contexts:
            c_on, c_off = _calls(patched, MAKERS[c], args.k, args.backend, args.calls)
            print(f"compiled call ({c:<9}): {c_on * 1e6:.1f} us with the checks, {c_off * 1e6:.1f} us suspended")


if __name__ == "__main__":
    main()
