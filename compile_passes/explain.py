"""``explain(fn, *args, **kwargs)``: what torch.compile does with a call's opaques.

It compiles ``fn`` through a recording backend (the lints of
:mod:`compile_passes.backend`, then ``aot_eager``, watched for opaque members
read below Dynamo), runs it once, and returns an :class:`Explanation`: per
graph the flat inputs with paths and sharing, the flatten contexts torch guards
on, the baked objects, the member values read while tracing, and the findings.
:meth:`Explanation.call` runs another call through the same compiled function
and records its recompilations, Dynamo's reasons in opaque terms.
``str(explanation)`` is a readable report.

A failing compilation (torch's "Guard failed on the same frame it was created"
for an identity-compared object in a flatten context, "cannot pickle ...
ProcessGroup" for a process group there) is recorded in
:attr:`Explanation.errors` after the graph was linted. Before torch's first
warning or error of a call (the guard it failed to build: some 30 lines on
stderr), the findings known by then are logged on this module's logger
(:class:`~compile_passes.ordering.FindingsFirst`).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import messages
from .backend import GraphCheck, checking_backend
from .collectives import group_findings
from .context import lint_contexts
from .findings import Finding
from .guards import translate_guard
from .ordering import FindingsFirst

_log = logging.getLogger(__name__)

__all__ = ["Explanation", "Recompile", "explain"]


@dataclass(frozen=True, slots=True)
class Recompile:
    """A recompilation: the frame's function, Dynamo's reason and its translation."""

    function: str
    guard: str
    reason: str


class Explanation:
    """The report of :func:`explain`.

    Attributes
    ----------
    graphs
        A :class:`~compile_passes.backend.GraphCheck` per compiled graph, in order.
    recompiles
        The recompilations seen by :meth:`call` (the first call compiles, it does not recompile).
    errors
        ``repr`` of each exception a call raised (compilation or run).
    outputs
        What the last successful call returned.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.graphs: list[GraphCheck] = []
        self.recompiles: list[Recompile] = []
        self.errors: list[str] = []
        self.outputs: Any = None
        self._fn = fn
        #: Findings on the arguments of a call whose compilation failed before any graph (the
        #: flatten contexts' lint, OSC001, run on the arguments themselves).
        self._argument_findings: list[Finding] = []
        backend = checking_backend("aot_eager", "record", on_check=self.graphs.append, watch_reads=True)
        self._compiled = torch.compile(fn, backend=backend)

    @property
    def findings(self) -> list[Finding]:
        """Every graph's findings, then those on the arguments of a call that
        failed to compile, each reported once (:attr:`Finding.key`: a member
        read or a collective call met in several graphs is one finding; a
        collective's names every group it was compiled for)."""
        groups = [g for graph in self.graphs for g in graph.groups]
        merged = {f.key: f for f in group_findings(groups)}
        seen: set[tuple[str, str]] = set()
        out = []
        for f in [*(f for graph in self.graphs for f in graph.findings), *self._argument_findings]:
            if f.key not in seen:
                seen.add(f.key)
                out.append(dataclasses.replace(merged[f.key], path=f.path) if f.key in merged else f)
        return out

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run one more call through the compiled function; returns its outputs
        (``None`` if it raised, recorded in :attr:`errors`)."""
        from torch._dynamo.utils import guard_failures

        before = {code: len(reasons) for code, reasons in guard_failures.items()}
        graphs_before = len(self.graphs)
        name = getattr(self._fn, "__qualname__", type(self._fn).__qualname__)
        first = FindingsFirst(
            lambda: [f for graph in self.graphs[graphs_before:] for f in graph.findings],
            _log,
            messages.findings_first_header(name),
        )
        try:
            with first:
                self.outputs = self._compiled(*args, **kwargs)
        except Exception as error:
            self.errors.append(
                f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            )
            self.outputs = None
            if len(self.graphs) == graphs_before:  # no graph to lint: lint what the call was given
                self._argument_findings.extend(_argument_findings(self._fn, args, kwargs))
        for code, reasons in list(guard_failures.items()):
            for reason in reasons[before.get(code, 0) :]:
                text = str(reason)
                self.recompiles.append(Recompile(code.co_name, text.split("\n", 1)[0].strip(), translate_guard(text)))
        return self.outputs

    def __str__(self) -> str:
        lines = [
            f"compile_passes.explain: {len(self.graphs)} graph(s), {len(self.recompiles)} recompilation(s), "
            f"{len(self.findings)} finding(s)"
        ]
        for graph in self.graphs:
            lines.append(f"graph {graph.index}")
            if graph.inputs is not None:
                lines.extend("  " + row for row in str(graph.inputs).splitlines())
            for path, cls, ctx in graph.contexts:
                lines.append(f"  context of {path} ({cls}), guarded with ==: {_short(ctx)}")
            for baked in graph.baked:
                note = f" - {baked.reason}" if baked.reason else ""
                lines.append(f"  baked {baked.how}: {baked.type_name} ({baked.origin}){note}")
            lines.extend(f"  read: {read}" for read in graph.reads)
        if self.findings:
            lines.append("findings")
            for f in self.findings:
                lines.append(f"  {f.code} ({f.severity}) {f.path}: {f.message}")
                lines.append("    fix: " + f.fix.replace("\n", "\n      "))
        if self.recompiles:
            lines.append("recompilations")
            lines.extend(f"  {r.function}: {r.reason}  [{r.guard}]" for r in self.recompiles)
        if self.errors:
            lines.append("errors")
            lines.extend(f"  {e}" for e in self.errors)
        return "\n".join(lines)


def _named_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(name, value)`` of a call's arguments, named as ``fn``'s parameters
    (``xs[0]`` for a ``*xs``), or ``args[i]`` when ``fn`` has no signature."""
    try:
        signature = inspect.signature(fn)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [(f"args[{i}]", a) for i, a in enumerate(args)] + list(kwargs.items())
    named: list[tuple[str, Any]] = []
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            named.extend((f"{name}[{i}]", v) for i, v in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.extend(value.items())
        else:
            named.append((name, value))
    return named


def _argument_findings(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Finding]:
    """OSC001 on the subclass arguments of a call that produced no graph (its
    compilation failed, for example on a flatten context torch cannot guard)."""
    findings: list[Finding] = []
    for name, value in _named_arguments(fn, args, kwargs):
        try:
            findings.extend(lint_contexts(value, name))
        except Exception as error:  # a report must not fail on what it reports about
            _log.debug("explain: no context lint for %s: %s", name, error)
    return findings


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Explanation:
    """Compile ``fn``, run ``fn(*args, **kwargs)`` once and explain its opaques in an
    :class:`Explanation`; its :meth:`Explanation.call` shows what other arguments recompile and why."""
    explanation = Explanation(fn)
    explanation.call(*args, **kwargs)
    return explanation
