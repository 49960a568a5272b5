"""Turning support on and off: ties the detected mode to the backport patches.

This module is what ``import opaque_subclass`` runs: in backport mode it
applies the torch version's patch set (all or nothing); in native mode it does
nothing; on an unsupported torch it warns and leaves torch untouched.
"""

from __future__ import annotations

import threading
import warnings

import torch

from .backport import PatchRefused, PatchSet, patch_set_for
from .mode import Mode, Support, _detect, _release

__all__ = ["disable", "enable", "support"]

_LOCK = threading.Lock()
_MODE: Mode = _detect()
_PATCH_SET: PatchSet | None = None
_REFUSED: str | None = None


def _unsupported_warning(detail: str, fix: str = "pip install 'torch>=2.11'") -> None:
    warnings.warn(
        f"opaque_subclass: torch {torch.__version__} is not supported ({detail}); torch is "
        "left untouched and opaque attributes in __tensor_flatten__ will not work under "
        "torch.compile. Supported: torch 2.11 (backport) and torch >= 2.12 (native). "
        f"Fix: {fix}.",
        RuntimeWarning,
        stacklevel=3,
    )


def enable() -> Support:
    """Apply the backport patches (backport mode); a no-op when already enabled,
    in native mode, or on an unsupported torch. Returns :func:`support`."""
    global _MODE, _PATCH_SET, _REFUSED
    with _LOCK:
        if _MODE == "backport" and _PATCH_SET is None:
            release = _release(torch.__version__)
            assert release is not None  # _detect() returned "backport"
            candidate = patch_set_for(release)
            if candidate is None:
                _MODE, _REFUSED = "unsupported", "no patch set for this torch"
                _unsupported_warning(_REFUSED)
            else:
                _PATCH_SET = candidate
        if _PATCH_SET is not None and not _PATCH_SET.enabled:
            try:
                _PATCH_SET.enable()
            except PatchRefused as e:
                _MODE, _REFUSED, _PATCH_SET = "unsupported", str(e), None
                _unsupported_warning(
                    f"this torch build differs from the one the backport was written for: {e}",
                    "install the official release, pip install torch==2.11.0, or torch >= 2.12, "
                    "which needs no backport",
                )
    return support()


def disable() -> Support:
    """Restore every patched torch function to the original object. Idempotent."""
    with _LOCK:
        if _PATCH_SET is not None:
            _PATCH_SET.disable()
    return support()


def support() -> Support:
    """The library's :class:`~opaque_subclass.Support` on the running torch."""
    patched = _PATCH_SET.targets if _PATCH_SET is not None else ()
    return Support(_MODE, torch.__version__, patched)


if _MODE == "unsupported":
    _unsupported_warning("no native support and no backport")
