"""#26 item 6: the finding that explains a failure of torch's comes before
torch's messages about it, and torch's messages are all still there.

A process group in a flatten context (of a subclass with a
``__metadata_guard__``, which torch honours and the library's input check
leaves to it) makes torch fail after tracing: the compile caches warn that
they cannot pickle the group (inductor), and Dynamo logs the guard it failed
to build (``Error while creating guard: ... cannot pickle ... ProcessGroup``)
before raising. Measured before the change (torch 2.11.0 and 2.15.0, fake and
1-rank gloo groups): ``explain`` printed nothing before torch's 30 lines, and
``checking_backend(watch_reads=True)`` warned after inductor's pickling
traceback. Each test records, in one ordered list, what torch's loggers, the
library's loggers and ``warnings`` say, as stderr would show it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from subclasses import ShardLike, ShardSpec, fake_world

import compile_passes as cp


class GroupInContext(ShardLike):
    """A sharded tensor with its process group inside the spec of its flatten
    context and a ``__metadata_guard__`` (as DTensor's subclasses have)."""

    @classmethod
    def __metadata_guard__(cls, orig: Any, other: Any) -> bool:
        return bool(orig == other)


class _Record(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(self.format(record).splitlines())


@pytest.fixture
def said() -> Iterator[list[str]]:
    """Everything said while the test runs, in order: torch's log records (all
    of them reach torch's own handlers too), the library's, and warnings."""
    record = _Record()
    loggers = [logging.getLogger("torch"), logging.getLogger("compile_passes")]
    for logger in loggers:
        logger.addHandler(record)
    with warnings.catch_warnings():
        warnings.simplefilter("always")

        def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
            record.lines.append(f"warning {category.__name__}: {message}")

        warnings.showwarning = show
        torch._dynamo.reset()
        try:
            yield record.lines
        finally:
            for logger in loggers:
                logger.removeHandler(record)
            torch._dynamo.reset()


def _first(lines: list[str], text: str) -> int:
    return next((i for i, line in enumerate(lines) if text in line), -1)


def _check_order(lines: list[str]) -> None:
    finding = _first(lines, "OSC001 (error) x.<context>.mesh")
    torch_said = [i for i, line in enumerate(lines) if "pickle" in line]  # the caches' warnings, the guard's error
    guard = _first(lines, "Error while creating guard")
    assert finding >= 0, lines
    assert guard > finding, ("torch's guard error, after the finding", lines)
    assert torch_said and min(torch_said) > finding, lines
    assert any("cannot pickle" in line and "ProcessGroup" in line for line in lines[guard:]), lines  # torch's error


def test_explain_logs_the_finding_before_torchs_guard_error(said):
    with fake_world(2) as world:
        report = cp.explain(lambda x: x * 2, GroupInContext(torch.ones(2), ctx=ShardSpec(world, 0)))
    (error,) = report.errors
    assert "cannot pickle" in error and "ProcessGroup" in error
    assert [f.code for f in report.findings] == ["OSC001"]
    _check_order(said)
    header = _first(said, "compile_passes.explain: findings on the compilation of")
    assert 0 <= header < _first(said, "OSC001"), said
    assert said[header].startswith("compile_passes.explain ERROR"), said[header]


@pytest.mark.parametrize("backend", ["watching", "opaque_check"])
def test_the_checking_backend_warns_before_torch_pickles(said, backend):
    """``checking_backend(inductor, watch_reads=True)`` warned only after the
    inner compilation (after inductor's pickling traceback, the first time in
    a process); now the graph's findings come before it. By name (inductor):
    the same, as before."""
    from torch._dynamo.backends.registry import lookup_backend

    def inductor(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        said.append("(the inner backend compiles)")
        return lookup_backend("inductor")(gm, example_inputs)

    chosen = cp.checking_backend(inductor, watch_reads=True) if backend == "watching" else backend
    with fake_world(2) as world:
        x = GroupInContext(torch.ones(2), ctx=ShardSpec(world, 0))
        with pytest.raises(Exception, match="cannot pickle") as raised:
            torch.compile(lambda x: x * 2, backend=chosen)(x)
    assert "ProcessGroup" in str(raised.value)
    finding = _first(said, "warning OpaqueCheckWarning: OSC001 (error) x.<context>.mesh")
    assert finding == _first(said, "OSC001"), said
    if backend == "watching":
        assert _first(said, "(the inner backend compiles)") > finding, said
    _check_order(said)
