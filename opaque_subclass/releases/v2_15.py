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

#: The torch source files the fingerprints of this release's rows are read from, and their digests
#: (ReleaseSupport.sources): unchanged files are hashed at import, not parsed.
SOURCES = (
    # recorded on torch 2.15.0+cu132 by tools/record_sources.py: do not edit by hand
    ("<fingerprints>", "4b46e0a0206925ef"),
    ("_custom_class_base.py", "f5d26e00ab0c8622"),
    ("_dynamo/convert_frame.py", "1c445cae3b8c8f23"),
    ("_dynamo/guards.py", "e88ae5570b4e3ed4"),
    ("_dynamo/variables/builder.py", "d9190f45e0b7a111"),
    ("_dynamo/variables/script_object.py", "330c7f0e039b8bd1"),
    ("_export/non_strict_utils.py", "943da6a25c871e33"),
    ("_functorch/_aot_autograd/autograd_cache.py", "abc6e31d8cfb4787"),
    ("_functorch/_aot_autograd/runtime_wrappers.py", "1ccec99314e97054"),
    ("_functorch/partitioners.py", "173dd35a0afee5c1"),
    ("_library/fake_class_registry.py", "60e1d5b41c996373"),
    ("_library/opaque_object.py", "b7f478540e3f61aa"),
    ("_subclasses/fake_tensor.py", "a40498a5ee8e3bf3"),
    ("distributed/device_mesh.py", "8ebcd19b62f08659"),
    ("fx/experimental/proxy_tensor.py", "803e400500281d93"),
    ("nn/utils/parametrize.py", "69723f1ba493954e"),
)

RELEASE = ReleaseSupport(
    (2, 15),
    "native",
    CUSTOM_CLASS_API,
    fixes=fix_rows((2, 15)),  # the table of fixes shared by releases: releases/fix_table.py
    limits=(FOREIGN_ISINSTANCE,),
    sources=SOURCES,
)
