"""Findings: what the lints report. Each says what happens, what it leads to and
how to fix it; the codes are stable (tests, docs and user filters use them):

======== ======== ==========================================================
code     severity what
======== ======== ==========================================================
OSC001   error    a reference-like object in a subclass's flatten context
OSC002   warning  a reference-like object baked into a graph as a constant
OSC003   info     inputs whose opaque sharing the graph is guarded on
OSC004   error    a value read from an opaque while tracing, compiled in with
                  no guard (``info`` when a guard protects it)
OSC005   warning  a collective on a process group named by a graph constant
                  (``error`` when nothing guards the group)
OSC006   info     a stage the lints read is not recorded on this torch: its
                  findings may be missing
======== ======== ==========================================================
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["CODES", "Finding", "OpaqueCheckError", "OpaqueCheckWarning", "Severity", "emit"]

Severity = Literal["error", "warning", "info"]

#: code -> (severity, title)
CODES: dict[str, tuple[Severity, str]] = {
    "OSC001": ("error", "reference-like object in a flatten context"),
    "OSC002": ("warning", "reference-like object baked into the graph"),
    "OSC003": ("info", "inputs share an opaque: identity guard"),
    "OSC004": ("error", "value read from an opaque while tracing, baked into the graph"),
    "OSC005": ("warning", "collective on a process group baked in by name"),
    "OSC006": ("info", "a stage the lints read is not observed on this torch"),
}

_log = logging.getLogger(__name__)


class OpaqueCheckWarning(UserWarning):
    """A finding of severity ``error`` or ``warning``, reported by ``warnings``."""


class OpaqueCheckError(RuntimeError):
    """Compilation stopped on a finding (``on_finding="raise"``)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(str(finding))
        self.finding = finding


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding of a lint.

    Attributes
    ----------
    code
        Stable code, a key of :data:`CODES`.
    severity
        ``"error"`` (a compiled call can compute with the wrong object),
        ``"warning"`` (it may) or ``"info"`` (what the graph depends on).
    subclass
        Qualified name of the subclass concerned, or ``None``.
    path
        Where: ``"x.<context>[0]"`` (first item of ``x``'s flatten context),
        ``"x._mesh"``, or a graph node.
    message
        What happens and what it leads to.
    fix
        What to change; code in backticks runs as written where it can.
    site
        What the finding stands for across graphs (a collective: op and source
        line), ``""`` when ``path`` says it; one :attr:`key`, one report.
    """

    code: str
    severity: Severity
    subclass: str | None
    path: str
    message: str
    fix: str
    site: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """``(code, site)``, else ``(code, path and message)``: equal for the same
        finding in another graph (a recompilation, the backward)."""
        return (self.code, self.site) if self.site else (self.code, f"{self.path}: {self.message}")

    @property
    def title(self) -> str:
        return CODES[self.code][1]

    def __str__(self) -> str:
        return f"{self.code} ({self.severity}) {self.path}: {self.message} Fix: {self.fix}"


def make(
    code: str,
    subclass: str | None,
    path: str,
    message: str,
    fix: str,
    *,
    severity: Severity | None = None,
    site: str = "",
) -> Finding:
    """A finding with its code's severity, or ``severity`` (OSC004: ``info`` when
    guarded; OSC005: ``error`` when nothing guards the group)."""
    return Finding(code, severity or CODES[code][0], subclass, path, message, fix, site)


def emit(findings: Iterable[Finding], on_finding: str, logger: logging.Logger | None = None) -> None:
    """Report ``findings``: ``"log"`` logs each at its severity's level;
    ``"warn"`` turns errors and warnings into :class:`OpaqueCheckWarning` (and
    logs them at ``INFO``, not twice); ``"raise"`` raises
    :class:`OpaqueCheckError` at the first error or warning. Info findings are
    only logged, at ``INFO``.
    """
    log = logger or _log
    for f in findings:
        level = {"error": logging.ERROR, "warning": logging.WARNING}.get(f.severity, logging.INFO)
        log.log(level if on_finding == "log" else logging.INFO, "%s", f)
        if f.severity == "info":
            continue
        if on_finding == "raise":
            raise OpaqueCheckError(f)
        if on_finding == "warn":
            warnings.warn(str(f), OpaqueCheckWarning, stacklevel=2)
