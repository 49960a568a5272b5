"""torch 2.15: native, with fixes. Everything the library does on this release.

torch 2.14's fixes (its partitioner still calls the deprecated
``is_opaque_value``), each with 2.15's own fingerprint where the source
changed: the AOTAutograd cache key that ignores which inputs share one opaque,
named errors at torch's entry points, guarded member values of opaques,
DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.releases.schema import CUSTOM_CLASS_API
from opaque_subclass.releases.shared import native_release

RELEASE = native_release((2, 15), CUSTOM_CLASS_API)
