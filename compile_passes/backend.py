"""The checking backend: ``torch.compile(fn, backend="opaque_check")``.

It lints every graph Dynamo gives it, reports the findings, then hands the graph
to an inner backend (``"inductor"`` by default). It works at compile time only:
the compiled callable is the inner backend's, unchanged, costing nothing per
call. With ``watch_reads=True`` it also watches the inner compilation for opaque
members read below Dynamo (OSC004, :mod:`compile_passes.reads`), reported after
it (before any error of the inner compilation propagates).

Findings come before the inner compilation, so one explaining a torch failure (a
process group in a flatten context: ``cannot pickle ... ProcessGroup`` from the
compile caches and from the guards Dynamo builds after the backend returns) is
on stderr before torch's messages about it.

``opaque_check`` is registered through the ``torch_dynamo_backends`` entry point
(``pyproject.toml``), so torch finds it without an import.
:func:`checking_backend` builds one with other settings::

    torch.compile(fn, backend=compile_passes.checking_backend(inner="aot_eager", on_finding="raise"))
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from opaque_subclass.core.checks import require_module
from opaque_subclass.core.errors import qualified_name
from opaque_subclass.fixes.autograd_cache import sharing_across_ranks

from . import messages
from .baked import baked_findings, baked_objects
from .collectives import BakedGroup, baked_groups, group_findings, with_reads
from .context import context_findings, subclass_levels
from .findings import Finding, OpaqueCheckError, emit
from .guards import graph_input_name, lint_sharing, sharing_report
from .inputs import InputReport
from .reads import BakedRead, ReadWatcher, lint_reads, traced_reads, unobserved_reads

__all__ = ["GraphCheck", "check_graph", "checking_backend", "graph_inputs", "opaque_check"]

_log = logging.getLogger(__name__)

_ON_FINDING = ("warn", "raise", "log", "record")


def graph_inputs(gm: torch.fx.GraphModule) -> list[tuple[str, Any]]:
    """``(name, real value)`` of each placeholder of a Dynamo graph, named as
    the user wrote it (``x``, ``self.w``); the values are the call's own
    objects, which Dynamo keeps on each placeholder."""
    require_module(gm, "compile_passes.graph_inputs", graph=True)
    named = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        value: Any = None
        name = node.name
        if grapharg is not None:
            source = getattr(grapharg, "source", None)
            if source is not None:
                raw = source.name() if callable(source.name) else source.name
                name = graph_input_name(str(raw))
            try:
                value = grapharg.example
            except Exception:  # a released weak reference: fall back to the fake
                value = None
        if value is None:
            value = node.meta.get("example_value", node.meta.get("val"))
        named.append((name, value))
    return named


@dataclass(frozen=True)
class GraphCheck:
    """What the lints saw in one graph.

    Attributes
    ----------
    index
        The graph's number, in compilation order.
    inputs
        Its flat inputs (tensors, opaques, symbolic sizes), with paths and sharing.
    contexts
        ``(path, subclass, context)`` for each (nested) subclass input: the contexts torch guards with ``==``.
    baked
        The non-tensor objects the graph uses without taking them as inputs.
    findings
        Every finding of the lints for this graph.
    reads
        Opaque members evaluated on the real object while tracing
        (:class:`~compile_passes.reads.BakedRead`): by Dynamo and, when watched, below Dynamo.
    groups
        Collectives on a process group named by a constant
        (:class:`~compile_passes.collectives.BakedGroup`): in Dynamo's graph and, when watched, below it.
    """

    index: int
    inputs: InputReport | None
    contexts: tuple[tuple[str, str, Any], ...]
    baked: tuple[Any, ...]
    findings: tuple[Finding, ...] = field(default=())
    reads: tuple[BakedRead, ...] = field(default=())
    groups: tuple[BakedGroup, ...] = field(default=())


def check_graph(gm: torch.fx.GraphModule, index: int = 0) -> GraphCheck:
    """Run every lint on a Dynamo graph. Called by a backend while Dynamo
    compiles, it also reports the member values Dynamo read while tracing
    this graph (OSC004, taken from the compilation's record)."""
    require_module(gm, "compile_passes.check_graph", graph=True)
    named = graph_inputs(gm)
    levels = [level for name, value in named for level in subclass_levels(value, name)]
    baked = tuple(baked_objects(gm))
    reads = tuple(traced_reads(named))
    findings = [*context_findings(levels), *baked_findings(baked, f"graph {index}")]
    findings.extend(lint_reads(reads, f"graph {index}"))
    findings.extend(unobserved_reads(named, f"graph {index}"))
    groups = tuple(baked_groups(gm))
    findings.extend(group_findings(groups, f"graph {index}"))
    try:
        report: InputReport | None = sharing_report(named)
    except Exception as error:  # an input the flat walk refuses: its own error surfaces in compilation
        _log.debug("opaque_check: no flat-input report for graph %d: %s", index, error)
        report = None
    if report is not None:
        parameters = frozenset(name for name, value in named if isinstance(value, torch.nn.Parameter))
        findings.extend(lint_sharing(report, parameters))
    shown = tuple((path, qualified_name(type(owner)), ctx) for path, owner, ctx in levels)
    return GraphCheck(index, report, shown, baked, tuple(findings), reads, groups)


def checking_backend(
    inner: str | Callable[..., Any] = "inductor",
    on_finding: str = "warn",
    *,
    on_check: Callable[[GraphCheck], None] | None = None,
    watch_reads: bool = False,
) -> Callable[..., Any]:
    """A backend that lints each graph, then compiles it with ``inner``.

    Parameters
    ----------
    inner
        The compiling backend: a name torch knows (``"inductor"``, ``"aot_eager"``, ...) or a callable.
    on_finding
        ``"warn"``: log every finding and warn (:class:`OpaqueCheckWarning`) for errors and
        warnings; ``"log"``: log only; ``"raise"``: stop with :class:`OpaqueCheckError` at the first
        error or warning; ``"record"``: report nothing (``on_check`` receives the findings).
    on_check
        Called with each graph's :class:`GraphCheck` (``compile_passes.explain`` records them).
    watch_reads
        Also watch the inner compilation, with a ``sys.setprofile`` hook on this thread, for the
        graph's opaque members read on the real object below Dynamo (a ``__torch_dispatch__``, a
        custom op's fake implementation: OSC004). It makes an ``aot_eager`` compilation 1.7 to 1.8
        times as long, so it is off by default (``explain`` turns it on). The graph's findings
        still come before the inner compilation; those of the reads after it, also when it fails.
        ``on_check`` receives them all, after it.
    """
    if on_finding not in _ON_FINDING:
        raise messages.unknown_on_finding(on_finding, _ON_FINDING)
    count = [0]
    said: set[tuple[str, str]] = set()  # one report per finding, not one per graph (recompilations, backward)
    said_lock = threading.Lock()

    def say(findings: Sequence[Finding]) -> None:
        if on_finding == "record":
            return
        if on_finding != "raise":
            with said_lock:
                findings = [f for f in findings if f.key not in said]
                said.update(f.key for f in findings)
        emit(findings, on_finding, _log)

    def report(check: GraphCheck) -> None:
        if on_check is not None:
            on_check(check)
        say(check.findings)

    def opaque_check(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor], **kwargs: Any) -> Any:
        require_module(gm, "compile_passes.opaque_check", graph=True)
        check = check_graph(gm, count[0])
        count[0] += 1
        compiler = inner
        if isinstance(compiler, str):
            from torch._dynamo.backends.registry import lookup_backend

            compiler = lookup_backend(compiler)
        if not watch_reads:
            report(check)
            return compiler(gm, example_inputs, **kwargs)
        try:  # the graph's findings first, before the inner compilation and anything torch says in it
            say(check.findings)
        except OpaqueCheckError:
            if on_check is not None:
                on_check(check)
            raise
        watcher = ReadWatcher(graph_inputs(gm))
        # under opaque_subclass.dtensor.share_compiles, a joint-graph pass replaces every collective on a
        # constant group that AOTAutograd traces by one taking its mesh input (or stops the compilation)
        rewritten = sharing_across_ranks()
        try:
            with watcher:
                return compiler(gm, example_inputs, **kwargs)
        finally:
            groups, reads = with_reads([] if rewritten else watcher.collectives, watcher.reads)
            below = [*lint_reads(reads, f"graph {check.index}"), *group_findings(groups, f"graph {check.index}")]
            if on_check is not None:
                on_check(
                    dataclasses.replace(
                        check,
                        findings=(*check.findings, *below),
                        reads=(*check.reads, *watcher.reads),
                        groups=(*check.groups, *groups),
                    )
                )
            say(below)

    return opaque_check


def opaque_check(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """``backend="opaque_check"``: the lints with ``on_finding="warn"``, then inductor."""
    return _DEFAULT(gm, example_inputs, **kwargs)


_DEFAULT = checking_backend()
