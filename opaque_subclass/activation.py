"""Turning support on and off: ties the running release's row of the version
table to its patch set (backport mode) and fix set (native mode).

This module is what ``import opaque_subclass`` runs: it applies the release's
patch set or fix set, each all or nothing; on an unsupported torch it warns and
leaves torch untouched.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Iterator

import torch

from opaque_subclass.core.registry import opaque_kind, register_opaque
from opaque_subclass.mode import Mode, Support
from opaque_subclass.patching import PatchRefused, PatchSet
from opaque_subclass.releases import OLDEST_SUPPORTED, ReleaseSupport, current

__all__ = ["disable", "enable", "support"]

_LOCK = threading.Lock()
_ROW: ReleaseSupport = current()
_MODE: Mode = _ROW.mode
_PATCH_SET: PatchSet | None = None
_FIX_SET: PatchSet | None = None
_REFUSED: str | None = None


def _supported_text() -> str:
    return f"torch {OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} (backport) and newer (native)"


def _unsupported_warning(detail: str, fix: str = "python -m pip install 'torch>=2.11'") -> None:
    warnings.warn(
        f"opaque_subclass: torch {torch.__version__} is not supported ({detail}); torch is "
        "left untouched and opaque attributes in __tensor_flatten__ will not work under "
        f"torch.compile. Supported: {_supported_text()}. Fix: {fix}.",
        RuntimeWarning,
        stacklevel=3,
    )


@contextlib.contextmanager
def _no_compile_in_flight() -> Iterator[None]:
    """Hold Dynamo's compile lock (when Dynamo is loaded): torch.compile compiles
    a frame under it, so patches and fixes change only between compilations
    and a graph is never compiled half with, half without them."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    compile_lock = getattr(convert_frame, "compile_lock", None)
    with compile_lock if compile_lock is not None else contextlib.nullcontext(), _LOCK:
        yield


def enable() -> Support:
    """Apply the release's backport patches or native fixes, all or nothing.

    A no-op when already enabled or on an unsupported torch. Waits for a
    compilation in flight in another thread to finish. Returns :func:`support`.
    """
    global _MODE, _PATCH_SET, _FIX_SET, _REFUSED
    with _no_compile_in_flight():
        if _MODE == "backport" and _PATCH_SET is None:
            _PATCH_SET = PatchSet(_ROW.patches, _ROW.sources) if _ROW.patches else None
            if _PATCH_SET is None:
                _MODE, _REFUSED = "unsupported", "no patch set for this torch"
                _unsupported_warning(_REFUSED)
        if _MODE == "native" and _FIX_SET is None and _REFUSED is None:
            _FIX_SET = PatchSet(_ROW.fixes, _ROW.sources) if _ROW.fixes else None
        if _PATCH_SET is not None and not _PATCH_SET.enabled:
            try:
                _PATCH_SET.enable()
            except PatchRefused as e:
                _MODE, _REFUSED, _PATCH_SET = "unsupported", str(e), None
                _unsupported_warning(
                    f"this torch build differs from the one the backport was written for: {e}",
                    "install the official release, python -m pip install torch==2.11.0, or "
                    "torch >= 2.12, which needs no backport",
                )
        if _FIX_SET is not None and not _FIX_SET.enabled:
            try:
                _FIX_SET.enable()
            except PatchRefused as e:
                # The feature is torch's own: native mode stands, without the fixes.
                _REFUSED, _FIX_SET = str(e), None
                warnings.warn(
                    f"opaque_subclass: the fixes for torch {_ROW.label} do not match this torch "
                    f"build ({e}); none is installed, so the upstream bugs listed in "
                    "docs/compatibility.md remain. Fix: install the official release, "
                    f"python -m pip install torch=={torch.__version__.split('+')[0]}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if _MODE != "unsupported":
            _register_torch_classes()
    return support()


def _register_torch_classes() -> None:
    """torch's ``ProcessGroup`` and ``DeviceMesh`` as reference opaques, with
    torch's own registration, at one moment on every release: when the library
    is enabled. torch registers them itself at moments that differ by release
    (2.14+: ``ProcessGroup`` with ``import torch``; 2.12+: both when
    ``torch.distributed.tensor`` is imported; 2.11: never), so without this
    ``opaque_kind`` of them, what a declaration may name, and whether a DTensor
    lists its mesh as a graph input (the 2.11 backport's ``dtensor`` patches
    do once ``DeviceMesh`` is registered) would depend on the release and on
    imports. Their modules are imported by ``import torch`` already; a registry
    entry outlives :func:`disable`, as torch's own does."""
    if not torch.distributed.is_available():
        return
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.distributed_c10d import ProcessGroup

    for cls in (ProcessGroup, DeviceMesh):
        if opaque_kind(cls) is None:
            register_opaque(cls)


def disable() -> Support:
    """Restore every patched torch function to the original object. Idempotent.

    Waits for a compilation in flight in another thread (``torch.compile``)
    to finish, so no graph is compiled across the change."""
    with _no_compile_in_flight():
        if _PATCH_SET is not None:
            _PATCH_SET.disable()
        if _FIX_SET is not None:
            _FIX_SET.disable()
    return support()


def support() -> Support:
    """The library's :class:`~opaque_subclass.Support` on the running torch."""
    patched = _PATCH_SET.targets if _PATCH_SET is not None else ()
    fixes = _FIX_SET.targets if _FIX_SET is not None else ()
    mode, problem = _MODE, _REFUSED
    if _PATCH_SET is not None and _PATCH_SET.removed is not None:
        mode, problem = "unsupported", f"the backport was removed: {_PATCH_SET.removed}"
    elif _FIX_SET is not None and _FIX_SET.removed is not None:
        problem = f"the fixes were removed: {_FIX_SET.removed}"
    return Support(mode, torch.__version__, patched, fixes, problem)


if _MODE == "unsupported":
    _unsupported_warning("; ".join(map(str, _ROW.differences)) or "no native support and no backport")
