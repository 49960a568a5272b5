"""What ``import opaque_subclass`` adds to ``import torch``: time and modules.

Runs fresh interpreters (``--runs`` of each, best time kept) that import
``torch`` alone and then ``torch`` followed by ``opaque_subclass`` (this
checkout first on the path), and prints the difference. Also lists which of the
heavy torch subsystems the library's import pulled in (none is expected: the
patches and fixes wait for their modules; see docs/backport.md, "Safety rules").

Usage::

    python benchmarks/bench_import.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
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
print(json.dumps({{"s": time.perf_counter() - t, "modules": len(sys.modules),
                   "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _best(imports: str, runs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    best: dict | None = None
    for _ in range(runs):
        code = _PROBE.format(imports=imports, heavy=HEAVY)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        if best is None or got["s"] < best["s"]:
            best = got
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    import torch

    base = _best("import torch", args.runs)
    lib = _best("import torch\nimport opaque_subclass", args.runs)
    print(f"torch {torch.__version__}, best of {args.runs} fresh interpreters each")
    print(f"import torch                  : {base['s']:.2f} s, {base['modules']} modules")
    print(f"import torch, opaque_subclass : {lib['s']:.2f} s, {lib['modules']} modules")
    print(f"added by opaque_subclass      : {lib['s'] - base['s']:.2f} s, {lib['modules'] - base['modules']} modules")
    print(f"heavy subsystems imported     : {', '.join(sorted(set(lib['heavy']) - set(base['heavy']))) or 'none'}")


if __name__ == "__main__":
    main()
