"""What the running torch supports, and in which mode this library runs.

``native``
    torch >= 2.12 handles opaque attributes in ``__tensor_flatten__`` itself;
    nothing is patched to provide the feature. Fixes for upstream bugs of that
    release may be installed (``Support.fixes``).
``backport``
    torch 2.11: the library supplies what torch lacks: the opaque registry
    bridge and the patches of ``opaque_subclass.backport``, listed in
    ``Support.patched``.
``unsupported``
    any other torch: importing works, a warning names the supported versions,
    and torch is left untouched.

The per-release facts live in one table, :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from dataclasses import dataclass

from opaque_subclass.releases import RELEASES, Mode

__all__ = ["SUPPORTED_TORCH", "Mode", "Support"]

#: torch releases ``(major, minor)`` and the mode used for each (from the one
#: table, :data:`opaque_subclass.releases.RELEASES`); newer releases are native
#: when torch has the feature.
SUPPORTED_TORCH: dict[tuple[int, int], Mode] = {
    release: row.mode for release, row in RELEASES.items() if row.mode != "unsupported"
}


@dataclass(frozen=True, slots=True)
class Support:
    """The library's mode on the running torch.

    Attributes
    ----------
    mode
        ``"native"``, ``"backport"`` or ``"unsupported"``.
    torch_version
        ``torch.__version__``.
    patched
        Qualified names of the torch functions replaced to provide the feature
        (backport mode); empty in native mode.
    fixes
        Qualified names of the torch functions replaced by fixes for upstream
        bugs of a native release (docs/compatibility.md says why for each);
        empty where none apply.
    problem
        Why the library is not fully on, when it is not: the release's patch or
        fix set was refused (this torch build's sources differ from the
        official release's) or removed after a patch failed to apply when torch
        imported its module. A removed backport makes the mode
        ``"unsupported"``; removed fixes leave ``"native"`` (the feature is
        torch's) without them. ``None`` when everything is on, or was turned
        off by :func:`~opaque_subclass.disable`.
    others
        What other packages did to the torch functions the library patches, and
        what the library did about it, one line each: a replacement built over
        another package's (``composed over physicsnemo: ...``), a fix left out
        because another package's replacement cannot take it (also in
        ``problem``, with the fix), ours kept beneath another package's after
        :func:`~opaque_subclass.disable`. Empty when no other package patched them.
    adopted
        The classes adopted with :func:`~opaque_subclass.adopt`, one line each:
        the class, the methods replaced on it, and each object of its flatten
        context made an opaque attribute (``_mesh <- <context>[0].mesh``).
        Empty when none is.
    """

    mode: Mode
    torch_version: str
    patched: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    problem: str | None = None
    others: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()
