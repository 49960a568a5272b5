"""What ``import opaque_subclass`` adds to ``import torch``: time, ratio and modules.

Runs ``--runs`` pairs of fresh interpreters: one imports ``torch`` alone, the
other ``torch`` and then ``opaque_subclass`` (this checkout first on the path),
the order alternating from pair to pair. Prints, per pair and as medians, the
time each took and the ratio ``(torch + opaque_subclass) / torch``, which is
what the import-cost target is held against (at most 1.10, or 0.15 s added);
and which of the heavy torch subsystems the library's import pulled in (none is
expected: the patches and fixes wait for their modules; see docs/backport.md,
"Safety rules"), and how many torch source files it parsed (none while the
release row's recorded sources (``releases/sources.json``) are unchanged: tools/record_sources.py).

Usage::

    python benchmarks/bench_import.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "torch._dynamo",
    "torch._inductor",
    "torch.distributed.tensor",
    "torch._functorch._aot_autograd.autograd_cache",
)

_PROBE = """
import json, sys, time
t = time.perf_counter()
{imports}
s = time.perf_counter() - t
parsed = None
if "opaque_subclass" in sys.modules:
    from opaque_subclass import patching
    parsed = patching._parsed.cache_info().misses
print(json.dumps({{"s": s, "modules": len(sys.modules), "parsed": parsed,
                   "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _run(imports: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    code = _PROBE.format(imports=imports, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="pairs of fresh interpreters")
    args = parser.parse_args()
    import torch

    torch_only, both = "import torch", "import torch\nimport opaque_subclass"
    pairs = []
    for i in range(args.runs):
        if i % 2:
            lib, base = _run(both), _run(torch_only)
        else:
            base, lib = _run(torch_only), _run(both)
        pairs.append((base, lib))
    ratios = [lib["s"] / base["s"] for base, lib in pairs]
    added = [lib["s"] - base["s"] for base, lib in pairs]
    base, lib = pairs[-1]
    print(f"torch {torch.__version__}, {args.runs} pairs of fresh interpreters (order alternating)")
    for n, (b, w) in enumerate(pairs):
        print(f"  pair {n}: torch {b['s']:.3f} s, torch + opaque_subclass {w['s']:.3f} s, ratio {w['s'] / b['s']:.3f}")
    print(f"import torch (median)                  : {statistics.median(b['s'] for b, _ in pairs):.3f} s")
    print(f"import torch, opaque_subclass (median) : {statistics.median(w['s'] for _, w in pairs):.3f} s")
    print(f"added by opaque_subclass (median)      : {statistics.median(added):.3f} s")
    print(
        f"paired ratio (median, min-max)         : {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
    )
    print(f"added modules                          : {lib['modules'] - base['modules']}")
    print(f"torch source files parsed              : {lib['parsed']}")
    print(
        f"heavy subsystems imported              : {', '.join(sorted(set(lib['heavy']) - set(base['heavy']))) or 'none'}"
    )


if __name__ == "__main__":
    main()
