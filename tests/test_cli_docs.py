"""docs/cli.md's options table lists exactly the options of ``python -m opaque_subclass``.

The command's options come from its ``--help`` text (``opaque_subclass.cli.main(["--help"])``,
the parser the command itself builds); the documented ones from the first column of the
``| option | effect |`` table of docs/cli.md. An option added to either side only fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opaque_subclass import cli

CLI_DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # argparse colours its help on Python >= 3.14 when asked to


def _help_text(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PYTHON_COLORS", "0")
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    return _ANSI.sub("", capsys.readouterr().out)


def options_in_help(text: str) -> set[str]:
    """Every option string (``-h``, ``--help``, ...) and positional name of an argparse help text.

    Arguments are the lines indented by two spaces under a section title (``options:``,
    ``positional arguments:``, an argument group's title); the invocation ends at the first run of
    two spaces, and ``--opt VALUE`` contributes ``--opt``.
    """
    found: set[str] = set()
    section = None
    for line in text.splitlines():
        if line and not line[0].isspace():
            section = line[:-1] if line.endswith(":") and not line.startswith("usage:") else None
            continue
        if section is None or not re.match(r"^  \S", line):
            continue
        invocation = re.split(r"\s{2,}", line.strip())[0]
        if invocation.startswith("-"):
            found.update(part.split()[0] for part in invocation.split(", "))
        elif section == "positional arguments":
            found.add(invocation.split()[0])
    return found


def options_in_doc(text: str) -> set[str]:
    """The options in the first column of the ``| option | effect |`` table."""
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if re.match(r"^\|\s*option\s*\|\s*effect\s*\|\s*$", line)]
    assert len(headers) == 1, f"{CLI_DOC}: expected one '| option | effect |' table, found {len(headers)}"
    found: set[str] = set()
    for line in lines[headers[0] + 2 :]:  # after the header and its |---| row
        if not line.startswith("|"):
            break
        first_cell = line.split("|")[1]
        found.update(span.split()[0] for span in re.findall(r"`([^`]+)`", first_cell))
    return found


def test_help_parser_reads_options_and_positionals():
    text = (
        "usage: prog [-h] [--level N] [-q] name\n\nA description.\n\n"
        "positional arguments:\n  name        the name\n\n"
        "options:\n  -h, --help  show this help message and exit\n"
        "  --level N   a level,\n              wrapped onto a second line\n"
        "  -q, --quiet\n              help on its own line\n\n"
        "extra:\n  a group's description\n\n  --with-choice {a,b}\n"
    )
    assert options_in_help(text) == {"name", "-h", "--help", "--level", "-q", "--quiet", "--with-choice"}


def test_doc_parser_reads_the_first_column():
    text = (
        "Options:\n\n| option | effect |\n| --- | --- |\n| `--no-demo` | skip `--x` |\n"
        "| `-h`, `--help` | usage |\n| `--level N` | a level |\n\nAfter.\n| `--not-in-table` | no |\n"
    )
    assert options_in_doc(text) == {"--no-demo", "-h", "--help", "--level"}


def test_cli_doc_lists_exactly_the_cli_options(capsys, monkeypatch):
    in_cli = options_in_help(_help_text(capsys, monkeypatch))
    in_doc = options_in_doc(CLI_DOC.read_text(encoding="utf-8"))
    assert {"-h", "--help", "--no-demo"} <= in_cli, f"the --help text was not read as expected: {in_cli}"
    undocumented, stale = sorted(in_cli - in_doc), sorted(in_doc - in_cli)
    assert not undocumented and not stale, (
        f"docs/cli.md's options table and `python -m opaque_subclass --help` differ: "
        f"undocumented options {undocumented} (add a row to the table), documented options the "
        f"command lacks {stale} (remove their rows)."
    )


def _documented_runs() -> dict[str, tuple[str, list[str], list[str]]]:
    """``torch X.Y`` -> (mode, patched names, fix names) of each real-output transcript of
    docs/cli.md (a ```text block starting with ``$ python -m opaque_subclass``)."""
    runs: dict[str, tuple[str, list[str], list[str]]] = {}
    for block in re.findall(r"```text\n(\$ python -m opaque_subclass.*?)```", CLI_DOC.read_text(), re.S):
        lines = block.splitlines()
        header = dict(m.groups() for ln in lines if (m := re.match(r"(torch|mode)\s+(\S+)$", ln)))
        lists: dict[str, list[str]] = {"patched": [], "fixes": []}
        current = None
        for ln in lines:
            if ln.startswith(("patched ", "fixes ")):
                current = ln.split()[0]
            elif ln.startswith("  - ") and current is not None:
                lists[current].append(ln[4:])
            else:
                current = None
        release = ".".join(header["torch"].split("+")[0].split(".")[:2])
        runs[release] = (header["mode"], lists["patched"], lists["fixes"])
    return runs


def test_transcripts_of_the_running_release_match_support():
    """A real-output transcript recorded on this torch release says the mode and lists the
    patched and fixed torch functions exactly as ``support()`` reports them now."""
    import torch

    import opaque_subclass as osc

    runs = _documented_runs()
    assert {"2.11", "2.12", "2.13"} <= set(runs), sorted(runs)
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if release not in runs:
        pytest.skip(f"docs/cli.md shows no transcript of torch {release}")
    info = osc.support()
    assert runs[release] == (info.mode, list(info.patched), list(info.fixes)), (
        f"docs/cli.md's torch {release} transcript is stale: rerun `python -m opaque_subclass` and paste it"
    )
