"""Backport of opaque attributes in ``__tensor_flatten__`` for torch versions
without native support.

One subpackage per torch version (``v2_11``), one module per torch area inside
it. Each module lists :class:`~opaque_subclass.backport.patching.Patch` objects:
the exact torch function replaced, the fingerprint of the original's source, and
a factory whose docstring says what changes with and without the patch.
:func:`patch_set_for` returns the set for a torch release; the package root
(``opaque_subclass``) enables it on import. The core modules of
``opaque_subclass`` never import this package.
"""

from __future__ import annotations

from .patching import Patch, PatchRefused, PatchSet, fingerprint

__all__ = ["Patch", "PatchRefused", "PatchSet", "fingerprint", "patch_set_for"]


def patch_set_for(release: tuple[int, int]) -> PatchSet | None:
    """The patch set for a torch ``(major, minor)`` release, or ``None``."""
    if release == (2, 11):
        from .v2_11 import PATCH_SET

        return PATCH_SET
    return None
