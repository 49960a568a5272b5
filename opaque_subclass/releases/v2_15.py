"""torch 2.15: native, with fixes. Everything the library does on this release.

torch 2.14's fixes (its partitioner still calls the deprecated
``is_opaque_value``), each with 2.15's own fingerprint where the source
changed: the AOTAutograd cache key that ignores which inputs share one opaque,
named errors at torch's entry points, guarded member values of opaques,
DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.releases.fix_table import fix_rows
from opaque_subclass.releases.schema import CUSTOM_CLASS_API, ReleaseSupport
from opaque_subclass.releases.shared import FOREIGN_ISINSTANCE
from opaque_subclass.releases.sources import recorded_sources

RELEASE = ReleaseSupport(
    (2, 15),
    "native",
    CUSTOM_CLASS_API,
    fixes=fix_rows((2, 15)),  # the table of fixes shared by releases: releases/fix_table.py
    limits=(FOREIGN_ISINSTANCE,),
    sources=recorded_sources((2, 15)),  # digests of the torch files read: releases/sources.json
)
