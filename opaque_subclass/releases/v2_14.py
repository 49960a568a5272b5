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

from opaque_subclass.releases.fix_table import fix_rows
from opaque_subclass.releases.schema import CUSTOM_CLASS_API, ReleaseSupport
from opaque_subclass.releases.shared import FOREIGN_ISINSTANCE

#: The torch source files the fingerprints of this release's rows are read from, and their digests
#: (ReleaseSupport.sources): unchanged files are hashed at import, not parsed.
SOURCES = (
    # recorded on torch 2.14.1+cu130 by tools/record_sources.py: do not edit by hand
    ("<fingerprints>", "72e5d233c79072d7"),
    ("_custom_class_base.py", "f5d26e00ab0c8622"),
    ("_dynamo/convert_frame.py", "b453c9d88aae46cf"),
    ("_dynamo/guards.py", "3ec7dc00edbf6156"),
    ("_dynamo/variables/builder.py", "900e23d3fad56363"),
    ("_dynamo/variables/script_object.py", "3894339cc3431945"),
    ("_dynamo/variables/tensor.py", "0ce323ae582d1268"),
    ("_export/non_strict_utils.py", "a61b9fa9a90bbac9"),
    ("_functorch/_aot_autograd/autograd_cache.py", "8f8357618ef656dd"),
    ("_functorch/_aot_autograd/runtime_wrappers.py", "d787a15203c68b53"),
    ("_functorch/_aot_autograd/subclass_utils.py", "3b98342a72983bb4"),
    ("_functorch/partitioners.py", "42a65410420df44a"),
    ("_library/fake_class_registry.py", "60e1d5b41c996373"),
    ("_library/opaque_object.py", "f3e0d89aba24d326"),
    ("_subclasses/fake_tensor.py", "a650411e6a7adde3"),
    ("distributed/device_mesh.py", "673bca57b78b606d"),
    ("fx/experimental/proxy_tensor.py", "ac78e70429eac827"),
    ("nn/utils/parametrize.py", "69723f1ba493954e"),
)

RELEASE = ReleaseSupport(
    (2, 14),
    "native",
    CUSTOM_CLASS_API,
    fixes=fix_rows((2, 14)),  # the table of fixes shared by releases: releases/fix_table.py
    limits=(FOREIGN_ISINSTANCE,),
    sources=SOURCES,
)
