"""Cost of the run-time checks of the generated unwrap/wrap, before/after in one process.

The fast path of ``unwrap_args`` / ``wrap_args(...,
is_runtime=True)`` (``opaque_subclass.core.codegen``) checks, on every call,
that each level's ``__tensor_flatten__`` still lists the metadata's names and
that each opaque slot holds a registered reference opaque
(``opaque_subclass.core.codegen.RuntimeChecks``, a parameter of the code
generation; docs/core.md, section 6). This script times bench_runtime.py's call
(one unwrap + one wrap of k arguments, ``flat`` and ``nested`` variants: the
run-time helpers' loop over the arguments, calling the functions generated per
meta) with functions generated under three settings, in the same process,
interleaved sample by sample:

* ``before``: no attribute-list check, no opaque-slot check (the code generated
  before these checks existed; tensor slots are always checked);
* ``names``: the attribute-list check only;
* ``after``: both (the library's setting).

Each figure is the minimum over ``--samples`` interleaved samples (the order of
the settings alternates), so load on the machine affects all settings alike.

Usage::

    python benchmarks/bench_runtime_checks.py [--ks 1,8,64] [--samples 200]
"""

from __future__ import annotations

import argparse
import gc
import sys
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_runtime as br  # the sibling benchmark's arguments and checks

from opaque_subclass import SubclassLayout, describe_args
from opaque_subclass.core.codegen import DEFAULT_CHECKS, RuntimeChecks, compiled_unwrap, compiled_wrap

SETTINGS = {
    "before": RuntimeChecks(names=False, opaque_slots=False),
    "names": RuntimeChecks(names=True, opaque_slots=False),
    "after": DEFAULT_CHECKS,
}


def _call(args: Sequence[Any], checks: RuntimeChecks) -> Callable[[], Any]:
    """bench_runtime's ``ours`` call (unwrap_args, then wrap_args
    with is_runtime=True: the same loop over the arguments), its functions generated
    with ``checks``."""
    metas = describe_args(args)
    runtime = [m.runtime_safe() if isinstance(m, SubclassLayout) else m for m in metas]
    unwraps = [compiled_unwrap(m, False, checks) if isinstance(m, SubclassLayout) else None for m in metas]
    wraps = [compiled_wrap(m, checks=checks) if isinstance(m, SubclassLayout) else m for m in runtime]

    def call() -> Any:
        flat: list[Any] = []
        for x, unwrap in zip(args, unwraps, strict=True):
            if unwrap is None:
                flat.append(x)
            else:
                flat.extend(unwrap(x))
        wrapped = tuple(w(flat) if callable(w) else flat[w.unwrapped_idx] for w in wraps)
        return flat, wrapped

    br.verify(args, call)
    return call


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 8, 64))
    parser.add_argument("--samples", type=int, default=200, help="interleaved samples per setting (default 200)")
    opts = parser.parse_args(argv)
    print("us per call (unwrap + wrap), minimum of interleaved samples; ratio to 'before'")
    for variant in br.VARIANTS:
        for k in opts.ks:
            args = br.make_args(variant, k)
            calls = {name: _call(args, checks) for name, checks in SETTINGS.items()}
            number = max(1, 2000 // k)
            best = dict.fromkeys(calls, float("inf"))
            gc.disable()
            try:
                for sample in range(opts.samples):
                    order = list(calls.items()) if sample % 2 else list(reversed(calls.items()))
                    for name, fn in order:
                        best[name] = min(best[name], timeit.timeit(fn, number=number) / number)
            finally:
                gc.enable()
            base = best["before"]
            cells = "  ".join(f"{n} {t * 1e6:9.3f} ({t / base:.3f})" for n, t in best.items())
            print(f"{variant:<7} k={k:<4} {cells}  opaque-slot checks alone {best['after'] / best['names']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
