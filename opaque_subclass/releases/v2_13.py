"""torch 2.13: native, with fixes. Everything the library does on this release.

The fixes of every native release: the AOTAutograd cache key that ignores
which inputs share one opaque, named errors at torch's entry points, guarded
member values of opaques, DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.releases.schema import OPAQUE_OBJECT_API
from opaque_subclass.releases.shared import native_release

RELEASE = native_release((2, 13), OPAQUE_OBJECT_API)
