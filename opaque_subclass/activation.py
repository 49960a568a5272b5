"""Turning support on and off: ties the running release's row of the version
table to its patch set (backport mode) and fix set (native mode).

This module is what ``import opaque_subclass`` runs on a supported torch
(:mod:`opaque_subclass.gate` decides that first): it applies the release's
patch set or fix set, each all or nothing.

What the library has done to torch is one immutable value, :class:`Activation`,
replaced whole (:func:`state`). Every change is a function of the current value
applied under one short lock that guards nothing else, so a change made by
:func:`enable` or :func:`disable` and one made by the import hook on another
thread (a set removed because a patch waiting for its module failed to apply)
never overwrite each other, and :func:`support` reads one value without working
anything out again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from opaque_subclass.adoption.adopt import adoptions
from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.core.registry import opaque_kind, register_opaque
from opaque_subclass.gate import unsupported_warning
from opaque_subclass.mode import Mode, Support
from opaque_subclass.patching import PatchRefused, PatchSet
from opaque_subclass.releases import ReleaseSupport, current

__all__ = ["BACKPORT", "FIXES", "Activation", "disable", "enable", "state", "support"]


@dataclass(frozen=True, slots=True)
class Activation:
    """What the library has done to the running torch (one value, never changed in place).

    Attributes
    ----------
    mode
        ``"native"``, ``"backport"`` or ``"unsupported"`` (a backport refused or removed).
    patched, fixes
        Targets of the backport's patches and of the native fixes while they are on.
    problem
        Why the library is not fully on: the set's refusal or removal; ``None`` otherwise.
    refused
        The release's set was refused when checked against this build: :func:`enable`
        does not try it again.
    others
        Other packages' replacements of our targets, and what was done about them
        (:attr:`Support.others`).
    """

    mode: Mode
    patched: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    problem: str | None = None
    refused: bool = False
    others: tuple[str, ...] = ()

    def support(self) -> Support:
        return Support(self.mode, torch.__version__, self.patched, self.fixes, self.problem, self.others)


def _others(patch_set: PatchSet, enabled: bool = True) -> tuple[str, ...]:
    """One line per target another package replaced (:attr:`Support.others`):
    while the set is on, what was built over or left out; after it was turned
    off, where ours stays beneath another package's."""
    held = tuple(f"{o} after opaque_subclass: disable() keeps it, and ours beneath it" for o in patch_set.held.values())
    if not enabled:
        return held
    return (
        *(f"{o}: ours is built over it" for o in patch_set.composed.values()),
        *(f"{o}: our fix is left out" for o in patch_set.blocked.values()),
        *held,
    )


_ROW: ReleaseSupport = current()
_LOCK = threading.RLock()  # one enable() or disable() at a time
_SWAP = threading.Lock()  # held only while the next value is computed from the current one


def _initial() -> Activation:
    if _ROW.mode == "backport" and not _ROW.patches:
        return Activation("unsupported", problem="no patch set for this torch", refused=True)
    return Activation(_ROW.mode)


_STATE: Activation = _initial()


def _change(step: Callable[[Activation], Activation]) -> Activation:
    """Replace the value by ``step(current value)``, atomically."""
    global _STATE
    with _SWAP:
        _STATE = step(_STATE)
        return _STATE


def _removed(kind: str) -> Callable[[str], None]:
    """The callback a set calls (from whichever thread imported the module) after
    it removed itself because a waiting patch failed to apply."""

    def on_removed(reason: str) -> None:
        if kind == "backport":
            _change(
                lambda s: dataclasses.replace(
                    s, mode="unsupported", patched=(), problem=f"the backport was removed: {reason}"
                )
            )
        else:
            _change(lambda s: dataclasses.replace(s, fixes=(), problem=f"the fixes were removed: {reason}"))

    return on_removed


#: The release's backport patch set (torch 2.11), made once; ``None`` elsewhere.
BACKPORT: PatchSet | None = (
    PatchSet(_ROW.patches, _ROW.sources, on_removed=_removed("backport"))
    if _ROW.mode == "backport" and _ROW.patches
    else None
)
#: The release's native fix set, made once; ``None`` where the release has none.
FIXES: PatchSet | None = (
    PatchSet(_ROW.fixes, _ROW.sources, on_removed=_removed("fixes"), independent=True)
    if _ROW.mode == "native" and _ROW.fixes
    else None
)


def state() -> Activation:
    """The current :class:`Activation`."""
    return _STATE


def _installed_factories() -> frozenset[str]:
    """The factories of the rows on now (what the recorder's writers are named by)."""
    on = {*_STATE.patched, *_STATE.fixes}
    return frozenset(p.make for p in (*_ROW.patches, *_ROW.fixes) if isinstance(p.make, str) and p.target in on)


RECORDER.follow(_installed_factories)


@contextlib.contextmanager
def _no_compile_in_flight() -> Iterator[None]:
    """Hold Dynamo's compile lock (when Dynamo is loaded): torch.compile compiles
    a frame under it, so patches and fixes change only between compilations
    and a graph is never compiled half with, half without them."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    compile_lock = getattr(convert_frame, "compile_lock", None)
    with compile_lock if compile_lock is not None else contextlib.nullcontext(), _LOCK:
        yield


def _enable_backport(patch_set: PatchSet) -> None:
    try:
        patch_set.enable()
    except PatchRefused as e:
        reason = str(e)
        _change(lambda s: dataclasses.replace(s, mode="unsupported", problem=reason, refused=True))
        if e.others and not e.build:  # the official build, and another package's patch in the way
            unsupported_warning(
                "another package replaced torch functions the backport patches, and its patches provide "
                f"the feature together: {patch_set.blocked_text(e.others).rpartition('. Fix: ')[0]}",
                patch_set.blocked_text(e.others).rpartition(". Fix: ")[2],
            )
        else:
            unsupported_warning(
                f"this torch build differs from the one the backport was written for: {reason}",
                "install the official release, python -m pip install torch==2.11.0, or "
                "torch >= 2.12, which needs no backport",
            )
        return

    def on(s: Activation) -> Activation:
        # read under the swap lock: a removal published before this step is kept
        if patch_set.removed is not None:
            return dataclasses.replace(
                s, mode="unsupported", patched=(), problem=f"the backport was removed: {patch_set.removed}"
            )
        return dataclasses.replace(
            s, mode="backport", patched=patch_set.targets, problem=None, others=_others(patch_set)
        )

    _change(on)


def _enable_fixes(fix_set: PatchSet) -> None:
    try:
        fix_set.enable()
    except PatchRefused as e:
        # The feature is torch's own: native mode stands, without the fixes.
        reason = str(e)
        _change(lambda s: dataclasses.replace(s, problem=reason, refused=True))
        warnings.warn(
            f"opaque_subclass: the fixes for torch {_ROW.label} do not match this torch "
            f"build ({reason}); none is installed, so the upstream bugs listed in "
            "docs/compatibility.md remain. Fix: install the official release, "
            f"python -m pip install torch=={torch.__version__.split('+')[0]}",
            RuntimeWarning,
            stacklevel=3,
        )
        return

    blocked = fix_set.blocked_text() if fix_set.blocked else None

    def on(s: Activation) -> Activation:
        if fix_set.removed is not None:
            return dataclasses.replace(s, fixes=(), problem=f"the fixes were removed: {fix_set.removed}")
        return dataclasses.replace(s, fixes=fix_set.targets, problem=blocked, others=_others(fix_set))

    _change(on)
    if blocked is not None:
        # Another package's patch, not this torch build: the other fixes are on.
        warnings.warn(
            f"opaque_subclass: {len(fix_set.blocked)} of the {len(fix_set.patches)} fixes for torch "
            f"{_ROW.label} are left out, the others are installed: {blocked}",
            RuntimeWarning,
            stacklevel=3,
        )


def enable() -> Support:
    """Apply the release's backport patches or native fixes, all or nothing.

    A no-op when already enabled, after the release's set was refused, or on an
    unsupported torch. Waits for a compilation in flight in another thread to
    finish. Returns :func:`support`.
    """
    with _no_compile_in_flight():
        if not _STATE.refused:
            if BACKPORT is not None and not BACKPORT.enabled:
                _enable_backport(BACKPORT)
            if FIXES is not None and not FIXES.enabled:
                _enable_fixes(FIXES)
        if _STATE.mode != "unsupported":
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
        others: tuple[str, ...] = ()
        for patch_set in (BACKPORT, FIXES):
            if patch_set is not None:
                patch_set.disable()
                others += _others(patch_set, enabled=False)
        _change(lambda s: dataclasses.replace(s, patched=(), fixes=(), others=others))
    return support()


def support() -> Support:
    """The library's :class:`~opaque_subclass.Support` on the running torch."""
    adopted = tuple(adoption.summary() for adoption in adoptions())
    state = _STATE.support()
    return dataclasses.replace(state, adopted=adopted) if adopted else state
