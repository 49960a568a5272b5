"""The examples of the docs and the README run and print what the docs say.

Runs ``docs/check_examples.py`` (every ``python`` block of ``docs/*.md`` and of
``README.md``, each file in a fresh interpreter) on the running torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_examples_run():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "check_examples.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"docs/check_examples.py exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr[-20000:]}"
    )


def test_compatibility_page_matches_the_version_table():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_compatibility.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
