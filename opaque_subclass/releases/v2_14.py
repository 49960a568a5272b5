"""torch 2.14: native, with fixes. Everything the library does on this release.

torch 2.14 renamed opaque objects to "custom classes" (``register_custom_class``,
``typ="symbolic" | "constant"``) and logs a deprecation for every use of the
old names; the library calls the new ones, and fixes torch's partitioner,
which still calls the deprecated ``is_opaque_value``. Then the fixes of every
native release: the AOTAutograd cache key that ignores which inputs share one
opaque, named errors at torch's entry points, guarded member values of
opaques, DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.releases.schema import CUSTOM_CLASS_API
from opaque_subclass.releases.shared import native_release

RELEASE = native_release((2, 14), CUSTOM_CLASS_API)
