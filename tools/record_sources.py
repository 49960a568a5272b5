"""Record, in the running torch release's row, the digests of the torch source
files its patch or fix fingerprints are read from (``ReleaseSupport.sources``).

With them, ``import opaque_subclass`` checks that those files are unchanged by
hashing them instead of parsing them (parsing was most of the import's cost);
any changed file and every fingerprint is read from the sources again, so a
stale record costs time, never correctness. Every fingerprint is checked
against the files before anything is written: a torch the row does not match
gets nothing recorded.

Usage (one torch release at a time, each leg's interpreter)::

    python tools/record_sources.py           # rewrite SOURCES in opaque_subclass/releases/v2_NN.py
    python tools/record_sources.py --check   # exit 1 when the recorded SOURCES differ
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_BLOCK = re.compile(r"^SOURCES = \(\n.*?^\)\n", re.S | re.M)


def render(sources: tuple[tuple[str, str], ...], torch_version: str) -> str:
    lines = [f'    ("{f}", "{d}"),\n' for f, d in sources]
    return (
        "SOURCES = (\n"
        f"    # recorded on torch {torch_version} by tools/record_sources.py: do not edit by hand\n"
        + "".join(lines)
        + ")\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the recorded digests differ")
    args = parser.parse_args()

    import torch

    from opaque_subclass.patching import record_sources
    from opaque_subclass.releases import current

    row = current()
    patches = row.patches or row.fixes
    if not patches:
        print(f"torch {row.label}: no patches or fixes, nothing to record")
        return 0
    sources = record_sources(patches)
    file = ROOT / "opaque_subclass" / "releases" / f"v{row.release[0]}_{row.release[1]}.py"
    text = file.read_text()
    if not _BLOCK.search(text):
        print(f"{file.relative_to(ROOT)} has no SOURCES block to rewrite", file=sys.stderr)
        return 2
    if args.check:
        if row.sources != sources:
            print(f"{file.relative_to(ROOT)}: SOURCES are stale for torch {torch.__version__}; rerun without --check")
            return 1
        print(f"{file.relative_to(ROOT)}: SOURCES up to date ({len(sources) - 1} files)")
        return 0
    file.write_text(_BLOCK.sub(lambda _: render(sources, torch.__version__), text, count=1))
    print(f"{file.relative_to(ROOT)}: {len(sources) - 1} files recorded on torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
