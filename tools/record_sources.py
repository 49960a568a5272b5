"""Record, for the running torch release, the digests of the torch source files its patch or
fix fingerprints are read from (``ReleaseSupport.sources``), in the release's entry of
``opaque_subclass/releases/sources.json`` (the release module reads it:
``sources=recorded_sources((2, NN))``).

With them, ``import opaque_subclass`` checks that those files are unchanged by
hashing them instead of parsing them (parsing was most of the import's cost);
any changed file and every fingerprint is read from the sources again, so a
stale record costs time, never correctness. Every fingerprint is checked
against the files before anything is written: a torch the row does not match
gets nothing recorded.

Usage (one torch release at a time, each leg's interpreter)::

    python tools/record_sources.py           # rewrite this release's entry of opaque_subclass/releases/sources.json
    python tools/record_sources.py --check   # exit 1 when the recorded entry differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FILE = ROOT / "opaque_subclass" / "releases" / "sources.json"


def _order(key: str) -> tuple[int, ...]:
    """Releases in order (``"2.9"`` before ``"2.13"``), after any other key."""
    return tuple(int(part) for part in key.split(".")) if key.replace(".", "").isdigit() else ()


def updated(table: dict[str, Any], label: str, torch_version: str, sources: tuple[tuple[str, str], ...]) -> str:
    """The text of ``sources.json`` with the entry of release ``label`` (``"2.13"``) recorded on
    ``torch_version``, the releases in order."""
    entries = {**table, label: {"torch": torch_version, "files": dict(sources)}}
    return json.dumps({key: entries[key] for key in sorted(entries, key=_order)}, indent=2) + "\n"


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
    module = ROOT / "opaque_subclass" / "releases" / f"v{row.release[0]}_{row.release[1]}.py"
    reads = f"recorded_sources(({row.release[0]}, {row.release[1]}))"
    # the row reads its entry directly, or through native_release((2, NN), ...)
    through = rf"(recorded_sources|native_release)\(\s*\({row.release[0]},\s*{row.release[1]}\)"
    if not re.search(through, module.read_text()):
        print(f"{module.relative_to(ROOT)} does not read its entry: sources={reads}", file=sys.stderr)
        return 2
    where = f"{FILE.relative_to(ROOT)} ({row.label})"
    if args.check:
        if row.sources != sources:
            print(f"{where}: the recorded sources are stale for torch {torch.__version__}; rerun without --check")
            return 1
        print(f"{where}: recorded sources up to date ({len(sources) - 1} files)")
        return 0
    table = json.loads(FILE.read_text(encoding="utf-8")) if FILE.exists() else {}
    FILE.write_text(updated(table, row.label, torch.__version__, sources), encoding="utf-8")
    print(f"{where}: {len(sources) - 1} files recorded on torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
