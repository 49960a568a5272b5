"""Cost of the run-time checks of the generated unwrap/wrap, before/after in one process.

The fast path of ``unwrap_tensor_subclasses`` / ``wrap_tensor_subclasses(...,
is_runtime=True)`` (``opaque_subclass.core.codegen``) checks, on every call,
that each level's ``__tensor_flatten__`` still lists the metadata's names and
that each opaque slot holds a registered reference opaque
(``opaque_subclass.core.codegen.CHECKS``; docs/core.md, section 6). This script
times bench_runtime.py's call (one unwrap + one wrap of k arguments, ``flat``
and ``nested`` variants) with functions generated under three settings, in the
same process, interleaved sample by sample:

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

from opaque_subclass import (
    SubclassCreationMeta,
    create_subclass_meta,
    unwrap_tensor_subclasses,
    wrap_tensor_subclasses,
)
from opaque_subclass.core import codegen

SETTINGS = {
    "before": {"names": False, "opaque_slots": False},
    "names": {"names": True, "opaque_slots": False},
    "after": {"names": True, "opaque_slots": True},
}


def _call(args: Sequence[Any], setting: dict[str, bool]) -> Callable[[], Any]:
    """bench_runtime's ``ours`` call, its functions generated under ``setting``."""
    saved = dict(codegen.CHECKS)
    codegen.CHECKS.update(setting)
    try:
        metas = create_subclass_meta(args)  # new metas: functions are generated per meta
        runtime = [m.runtime_safe() if isinstance(m, SubclassCreationMeta) else m for m in metas]

        def call() -> Any:
            flat = unwrap_tensor_subclasses(args, is_joint_structure=False, subclass_metas=metas)
            return flat, wrap_tensor_subclasses(flat, subclass_metas=runtime, is_runtime=True)

        br.verify(args, call)  # generates both functions now, under this setting
        return call
    finally:
        codegen.CHECKS.clear()
        codegen.CHECKS.update(saved)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 8, 64))
    parser.add_argument("--samples", type=int, default=200, help="interleaved samples per setting (default 200)")
    opts = parser.parse_args(argv)
    print("us per call (unwrap + wrap), minimum of interleaved samples; ratio to 'before'")
    for variant in br.VARIANTS:
        for k in opts.ks:
            args = br.make_args(variant, k)
            calls = {name: _call(args, setting) for name, setting in SETTINGS.items()}
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
