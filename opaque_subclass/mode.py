"""What the running torch supports, and in which mode this library runs.

``native``
    torch >= 2.12 handles opaque attributes in ``__tensor_flatten__`` itself;
    nothing is patched.
``backport``
    torch 2.11: the library supplies what torch lacks: the opaque registry
    bridge and the patches of ``opaque_subclass.backport``, listed in
    ``Support.patched``.
``unsupported``
    any other torch: importing works, a warning names the supported versions,
    and torch is left untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["SUPPORTED_TORCH", "Mode", "Support"]

Mode = Literal["native", "backport", "unsupported"]

#: torch versions (major, minor) and the mode used for each; newer ones are native.
SUPPORTED_TORCH: dict[tuple[int, int], Mode] = {(2, 11): "backport", (2, 12): "native"}


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
        Qualified names of the torch functions replaced; empty in native mode.
    """

    mode: Mode
    torch_version: str
    patched: tuple[str, ...] = ()


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _has_native_opaque_attrs() -> bool:
    try:
        from torch._functorch._aot_autograd import schemas
    except ImportError:  # pragma: no cover - torch without AOTAutograd
        return False
    return hasattr(schemas, "OpaqueMeta")


def _detect() -> Mode:
    release = _release(torch.__version__)
    if release is None:
        return "unsupported"
    if release >= (2, 12):
        return "native" if _has_native_opaque_attrs() else "unsupported"
    return SUPPORTED_TORCH.get(release, "unsupported")
