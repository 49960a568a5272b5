"""Patches of torch: the backport of opaque attributes for releases without
native support, and fixes for upstream bugs of native releases.

One subpackage per torch release (``v2_11`` a backport, ``v2_12`` fixes), one
module per torch area inside it. Each module lists
:class:`~opaque_subclass.backport._machinery.patching.Patch` objects: the exact torch
function replaced, the fingerprint of the original's source, and a factory
whose docstring says what changes with and without the patch. Which subpackage
serves which release is said by the version table
(:mod:`opaque_subclass._versions`); :mod:`opaque_subclass.activation` enables
it on import. The core modules of ``opaque_subclass`` never import this package.
"""

from __future__ import annotations

from opaque_subclass.backport._machinery.patching import Patch, PatchRefused, PatchSet, fingerprint

__all__ = ["Patch", "PatchRefused", "PatchSet", "fingerprint"]
