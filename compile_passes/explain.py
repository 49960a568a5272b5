"""``explain(fn, *args, **kwargs)``: what torch.compile does with a call's opaques.

It compiles ``fn`` through a recording backend (the lints of
:mod:`compile_passes.backend`, then Dynamo's ``eager``), runs it once, and
returns an :class:`Explanation`: per graph the flat inputs with their paths and
sharing, the flatten contexts torch guards on, the objects baked into it, and
the findings. :meth:`Explanation.call` runs another call through the same
compiled function and records the recompilations it causes, with Dynamo's
reasons translated into opaque terms. ``str(explanation)`` is a readable report.

A compilation that fails (torch's "Guard failed on the same frame it was
created" for an identity-compared object in a flatten context) is recorded in
:attr:`Explanation.errors` after the graph was linted, so the report says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .backend import GraphCheck, checking_backend
from .findings import Finding
from .guards import translate_guard

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
        The recompilations seen by :meth:`call` (the first call compiles, it
        does not recompile).
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
        self._compiled = torch.compile(fn, backend=checking_backend("eager", "record", on_check=self.graphs.append))

    @property
    def findings(self) -> list[Finding]:
        """Every graph's findings, each reported once."""
        seen: set[tuple[str, str, str]] = set()
        out = []
        for graph in self.graphs:
            for f in graph.findings:
                key = (f.code, f.path, f.message)
                if key not in seen:
                    seen.add(key)
                    out.append(f)
        return out

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run one more call through the compiled function; returns its outputs
        (``None`` if it raised, recorded in :attr:`errors`)."""
        from torch._dynamo.utils import guard_failures

        before = {code: len(reasons) for code, reasons in guard_failures.items()}
        try:
            self.outputs = self._compiled(*args, **kwargs)
        except Exception as error:
            self.errors.append(
                f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            )
            self.outputs = None
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
        if self.findings:
            lines.append("findings")
            for f in self.findings:
                lines.append(f"  {f.code} ({f.severity}) {f.path}: {f.message}")
                lines.append(f"    fix: {f.fix}")
        if self.recompiles:
            lines.append("recompilations")
            lines.extend(f"  {r.function}: {r.reason}  [{r.guard}]" for r in self.recompiles)
        if self.errors:
            lines.append("errors")
            lines.extend(f"  {e}" for e in self.errors)
        return "\n".join(lines)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Explanation:
    """Compile ``fn``, run ``fn(*args, **kwargs)`` once and explain its opaques.

    Returns an :class:`Explanation`; call :meth:`Explanation.call` with other
    arguments to see what recompiles and why.
    """
    explanation = Explanation(fn)
    explanation.call(*args, **kwargs)
    return explanation
