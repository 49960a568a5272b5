"""The version check that ``import opaque_subclass`` runs before anything else.

The API imports torch's opaque-object machinery by name
(``torch._library.opaque_object.MemberType``, base classes, AOTAutograd's metas),
which a torch without the feature lacks. On a release the table marks
unsupported (torch 2.10 and older, an unparsable version, a development build
without the feature) the package imports nothing else: it warns once, leaves
torch untouched and offers the surface below (import, :func:`support`, defining
opaque classes); every other name raises an ``ImportError`` saying why and how to fix it.

This module imports only ``torch`` and layer 0's data modules (``releases``,
``mode``); ``tests/test_gate.py`` fails when their module-level imports reach
below ``torch``'s top level.
"""

from __future__ import annotations

import warnings

import torch

from opaque_subclass.mode import Support
from opaque_subclass.releases import OLDEST_SUPPORTED, current

__all__ = [
    "REFUSAL",
    "OpaqueBase",
    "disable",
    "enable",
    "is_opaque",
    "opaque_kind",
    "refused_name",
    "register_opaque",
    "support",
    "supported_text",
    "unsupported_warning",
]

#: The fix printed with every refusal of the running torch.
UPGRADE_FIX = "python -m pip install 'torch>=2.11'"


def _refusal() -> str | None:
    row = current()
    if row.mode != "unsupported":
        return None
    return "; ".join(map(str, row.differences)) or "no native support and no backport"


#: Why the running torch is not supported, from the release table; ``None`` on a supported
#: release (whose sets may still be refused against this build's sources: :mod:`opaque_subclass.activation`).
REFUSAL: str | None = _refusal()


def supported_text() -> str:
    """The supported releases, in one phrase."""
    return f"torch {OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} (backport) and newer (native)"


def unsupported_warning(detail: str, fix: str = UPGRADE_FIX, stacklevel: int = 3) -> None:
    """Warn that the library is off on this torch: why, what is supported, the fix."""
    warnings.warn(
        f"opaque_subclass: torch {torch.__version__} is not supported ({detail}); torch is "
        "left untouched and opaque attributes in __tensor_flatten__ will not work under "
        f"torch.compile. Supported: {supported_text()}. Fix: {fix}.",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


def refused_name(name: str) -> ImportError:
    """The error for a name of the API that needs a supported torch."""
    return ImportError(
        f"opaque_subclass.{name} needs a supported torch: torch {torch.__version__} is not "
        f"supported ({REFUSAL}), so the library imported only its version check: support(), "
        "enable(), disable(), OpaqueBase, register_opaque(), is_opaque(), opaque_kind() and the error "
        f"classes. Supported: {supported_text()}. Fix: {UPGRADE_FIX}",
        name=name,
    )


# The surface of a refused torch: the same names as the API's, behaving as the
# library does where it is off.


def support() -> Support:
    """``mode="unsupported"``, nothing patched (see :func:`opaque_subclass.support`)."""
    return Support("unsupported", torch.__version__)


def enable() -> Support:
    """A no-op on an unsupported torch."""
    return support()


def disable() -> Support:
    """A no-op on an unsupported torch."""
    return support()


class OpaqueBase:
    """Stand-in base class on a torch without opaque objects: modules defining opaque
    classes still import; registering one raises (:func:`register_opaque`)."""


def register_opaque(cls: type, kind: str = "reference", **options: object) -> None:
    """Raises: opaque types need a supported torch."""
    raise RuntimeError(
        f"cannot register {cls.__qualname__} as an opaque type: opaque types are not supported on "
        f"torch {torch.__version__} ({REFUSAL}). Fix: {UPGRADE_FIX}"
    )


def is_opaque(obj: object) -> bool:
    """``False``: no object is an opaque on a torch without them."""
    return False


def opaque_kind(obj: object) -> None:
    """``None``: no class is an opaque type on a torch without them."""
    return None
