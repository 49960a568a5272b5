"""Findings before torch's messages: :class:`FindingsFirst`.

A finding often explains an error torch logs while compiling (a process group
in a flatten context: ``Error while creating guard: ... cannot pickle ...
ProcessGroup``, some 30 lines, and cache warnings), but
:func:`compile_passes.explain` returns its findings after the call.

While a :class:`FindingsFirst` is active, the first ``WARNING``-or-above record
of a ``torch``/``torch.*`` logger that reaches a handler first logs the
pending errors and warnings on the given logger; torch's record is then
handled unchanged. It works by a filter on each handler of torch's loggers and
the root logger, present only while active.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from .findings import Finding, emit

__all__ = ["FindingsFirst"]


def _torch_handlers() -> list[logging.Handler]:
    """The handlers a torch record can reach: those of torch's loggers and the root logger's."""
    found: dict[int, logging.Handler] = {}
    loggers = [logging.getLogger()]
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger):
            loggers.append(logger)
    for logger in loggers:
        for handler in logger.handlers:
            found.setdefault(id(handler), handler)
    return list(found.values())


class FindingsFirst(logging.Filter):
    """``with FindingsFirst(pending, logger, header):`` - before torch's first
    warning or error in the block, log ``header`` and the findings
    ``pending()`` returns (each once; nothing when there are none)."""

    def __init__(self, pending: Callable[[], Sequence[Finding]], logger: logging.Logger, header: str) -> None:
        super().__init__()
        self._pending = pending
        self._logger = logger
        self._header = header
        self._said: set[tuple[str, str, str]] = set()
        self._handlers: list[logging.Handler] = []
        self._busy = False
        #: How many findings were logged ahead of torch's records.
        self.announced = 0

    def __enter__(self) -> FindingsFirst:
        self._handlers = _torch_handlers()
        for handler in self._handlers:
            handler.addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for handler in self._handlers:
            handler.removeFilter(self)
        self._handlers = []

    def filter(self, record: logging.LogRecord) -> bool:
        """Always ``True``; before torch's first warnings and errors, logs the findings."""
        if self._busy or record.levelno < logging.WARNING:
            return True
        if record.name != "torch" and not record.name.startswith("torch."):
            return True
        self._busy = True  # the findings' own records pass through this filter too
        try:
            fresh = []
            for f in self._pending():
                key = (f.code, f.path, f.message)
                if f.severity != "info" and key not in self._said:
                    self._said.add(key)
                    fresh.append(f)
            if fresh:
                self._logger.log(
                    max(logging.ERROR if f.severity == "error" else logging.WARNING for f in fresh), "%s", self._header
                )
                emit(fresh, "log", self._logger)
                self.announced += len(fresh)
        except Exception as error:  # a filter that raises would lose torch's record: never raise
            self._logger.debug("compile_passes: findings not announced: %s", error)
        finally:
            self._busy = False
        return True
