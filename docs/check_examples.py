"""Run the Python examples of the docs.

Usage::

    python docs/check_examples.py [FILE.md ...]     # default: docs/*.md and README.md
    python docs/check_examples.py --update FILE.md  # rewrite the recorded outputs that differ
    python docs/check_examples.py --in-process FILE.md  # one file, in this interpreter

Every fenced ``python`` block of a Markdown file is executed, except a block
whose previous non-blank line is ``<!-- no-run -->``, and a block whose previous
non-blank line is ``<!-- torch >= 2.12 -->`` on an older torch (an example of a
behaviour the release table lists as that release's difference). The blocks of one file
run in order, in one namespace (a fresh ``__main__`` module), in a separate
interpreter per file (``-j N``: N files at once), so registrations made by one
file cannot leak into another. A block followed by the line ``<!-- output -->``
and then a fenced block must print exactly that block's text (trailing
whitespace ignored).

Prints one line per block and exits 1 if any block raised or printed something
else than its recorded output, else 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import difflib
import io
import os
import re
import subprocess
import sys
import textwrap
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
NO_RUN = "<!-- no-run -->"
OUTPUT = "<!-- output -->"
MIN_TORCH = re.compile(r"^<!-- torch >= (\d+)\.(\d+) -->$")
FENCE = re.compile(r"^\s*(`{3,})(\w*)\s*$")  # also fences indented in a list item
# Markdown files of docs/ that are not pages, whose blocks are not examples: errors_source.md
# is the source docs/gen_errors.py writes errors.md from; its blocks are the triggers of
# errors, which raise (the generator runs them). Left out of the default files, and a file
# given by name (tests/test_docs.py passes every docs/*.md) has no blocks to run.
NOT_PAGES = frozenset({"errors_source.md"})


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the first code line
    code: str
    expected: str | None  # recorded output, if any
    output_lines: tuple[int, int] | None = None  # 0-based [start, end) of the recorded output's lines
    min_torch: tuple[int, int] | None = None  # runs only on this torch release or newer


def _fence_end(lines: list[str], start: int, ticks: str) -> int:
    for j in range(start, len(lines)):
        if lines[j].strip() == ticks:
            return j
    raise SystemExit(f"unclosed code fence opened before line {start}")


def extract(text: str) -> list[Block]:
    """The runnable ``python`` blocks of a Markdown text, in order."""
    lines = text.splitlines()
    blocks: list[Block] = []
    previous = ""  # last non-blank line outside code
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        ticks, lang = m.groups()
        end = _fence_end(lines, i + 1, ticks)
        body = textwrap.dedent("\n".join(lines[i + 1 : end]))
        first_line = i + 2  # 1-based line of the first code line
        runnable = lang == "python" and previous != NO_RUN
        wanted = MIN_TORCH.match(previous)
        min_torch = (int(wanted.group(1)), int(wanted.group(2))) if wanted else None
        previous = ""
        i = end + 1
        if not runnable:
            continue
        expected = None
        k = i
        while k < len(lines) and not lines[k].strip():
            k += 1
        if k < len(lines) and lines[k].strip() == OUTPUT:
            k += 1
            while k < len(lines) and not lines[k].strip():
                k += 1
            out = FENCE.match(lines[k]) if k < len(lines) else None
            if not out:
                raise SystemExit(f"{OUTPUT} at line {k} is not followed by a code fence")
            out_end = _fence_end(lines, k + 1, out.group(1))
            expected = "\n".join(lines[k + 1 : out_end])
            output_lines = (k + 1, out_end)
            i = out_end + 1
        blocks.append(Block(first_line, body, expected, output_lines if expected is not None else None, min_torch))
    return blocks


def _torch_release() -> tuple[int, int]:
    import torch

    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def run_file(path: Path, update: bool = False) -> int:
    """Execute the blocks of one file in this interpreter; return the failure count.
    With ``update``, a block whose output differs gets its recorded output
    rewritten with what it printed (and does not count as a failure)."""
    sys.path.insert(0, str(ROOT))  # import the checkout's packages, not a stale install
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module  # classes defined in examples pickle as __main__.X
    failures = 0
    blocks = [] if path.parent.resolve() == DOCS and path.name in NOT_PAGES else extract(path.read_text())
    rewrites: list[tuple[tuple[int, int], str]] = []
    for block in blocks:
        where = f"{path.name}:{block.line}"
        if block.min_torch is not None and _torch_release() < block.min_torch:
            print(f"skip {where} (torch >= {block.min_torch[0]}.{block.min_torch[1]})")
            continue
        source = "\n" * (block.line - 1) + block.code  # tracebacks show Markdown line numbers
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(source, str(path), "exec"), module.__dict__)
        except BaseException:
            failures += 1
            print(f"FAIL {where}\n{buf.getvalue()}{traceback.format_exc()}")
            continue
        if block.expected is not None and _normalize(buf.getvalue()) != _normalize(block.expected):
            if update and block.output_lines is not None:
                rewrites.append((block.output_lines, _normalize(buf.getvalue())))
                print(f"updated {where}")
                continue
            failures += 1
            diff = difflib.unified_diff(
                _normalize(block.expected).splitlines(),
                _normalize(buf.getvalue()).splitlines(),
                "recorded output",
                "actual output",
                lineterm="",
            )
            print(f"FAIL {where}: output differs\n" + "\n".join(diff))
            continue
        print(f"ok   {where}" + (" (output checked)" if block.expected is not None else ""))
    if rewrites:
        lines = path.read_text().splitlines()
        for (start, end), text in sorted(rewrites, reverse=True):
            lines[start:end] = text.splitlines()
        path.write_text("\n".join(lines) + "\n")
    print(f"{path.name}: {len(blocks) - failures} of {len(blocks)} blocks passed")
    return failures


def _run_in_subprocess(path: Path, update: bool = False) -> tuple[int, str]:
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--in-process",
            *(["--update"] if update else []),
            str(path.resolve()),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc.returncode, proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: docs/*.md, README.md)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="files checked at once (default: 1; 0: one per CPU)")
    parser.add_argument(
        "--update", action="store_true", help="rewrite each recorded output that differs with what the block printed"
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the one FILE in this interpreter, as the runner's interpreter per file does (tests/test_docs.py)",
    )
    args = parser.parse_args(argv)
    if args.in_process:
        if len(args.files) != 1:
            parser.error("--in-process runs exactly one FILE")
        (path,) = args.files
        return 1 if run_file(path, args.update) else 0
    files = args.files or [*sorted(p for p in DOCS.glob("*.md") if p.name not in NOT_PAGES), ROOT / "README.md"]
    jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)
    status = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_run_in_subprocess, path, args.update) for path in files]
        import torch  # while the files run

        for future in futures:  # report in file order
            returncode, output = future.result()
            print(output, end="", flush=True)
            status |= returncode != 0
    print(f"torch {torch.__version__}: " + ("FAILED" if status else "all examples passed"))
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
