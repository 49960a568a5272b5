"""What the running torch supports, and in which mode this library runs.

``native``
    torch >= 2.12 handles opaque attributes itself; only fixes for upstream
    bugs of the release may be installed (``Support.fixes``).
``backport``
    torch 2.11: the library supplies the opaque registry bridge and the
    patches of ``opaque_subclass.backport`` (``Support.patched``).
``unsupported``
    any other torch: importing works, a warning names the supported versions,
    and torch is left untouched.

The per-release facts live in one table, :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from dataclasses import dataclass

from opaque_subclass.releases import RELEASES, Mode

__all__ = ["SUPPORTED_TORCH", "Mode", "Support"]

#: torch releases ``(major, minor)`` and their mode (from :data:`opaque_subclass.releases.RELEASES`);
#: newer releases are native when torch has the feature.
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
        bugs of a native release (docs/compatibility.md says why for each).
    problem
        Why the library is not fully on: the patch or fix set was refused (this
        build's sources differ from the official release's) or removed after a
        patch failed to apply on import. A removed backport makes the mode
        ``"unsupported"``; removed fixes leave ``"native"`` without them.
        ``None`` when all is on, or turned off by :func:`~opaque_subclass.disable`.
    others
        One line per thing other packages did to the patched functions and the
        library's answer: composed over another's (``composed over physicsnemo:
        ...``), a fix left out that another's replacement cannot take (also in
        ``problem``), ours kept beneath another's after :func:`~opaque_subclass.disable`.
    adopted
        One line per class adopted with :func:`~opaque_subclass.adopt`: the
        class, its replaced methods, and each context object made an opaque
        attribute (``_mesh <- <context>[0].mesh``).
    """

    mode: Mode
    torch_version: str
    patched: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    problem: str | None = None
    others: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()
