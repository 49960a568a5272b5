"""The command line shared by the page generators (``gen_compatibility.py``,
``gen_errors.py``): write the page, or with ``--check`` compare and exit 1
with a diff when it is stale."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path


def write_or_check(page: Path, new: str, description: str, argv: list[str] | None = None) -> int:
    """Write ``new`` to ``page``; with ``--check`` in ``argv`` only compare (0: up to date)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 with a diff if out of date")
    args = parser.parse_args(argv)
    if not args.check:
        page.write_text(new)
        return 0
    old = page.read_text() if page.exists() else ""
    if new != old:
        diff = difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), page.name, "generated"
        )
        sys.stderr.write("".join(diff))
        print(f"{page} is out of date: run python docs/{Path(sys.argv[0]).name}", file=sys.stderr)
        return 1
    print(f"{page.name} is up to date")
    return 0
