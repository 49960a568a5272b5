"""torch 2.13: native, with fixes. Everything the library does on this release.

The fixes of every native release: the AOTAutograd cache key that ignores
which inputs share one opaque, named errors at torch's entry points, guarded
member values of opaques, DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.releases.fix_table import fix_rows
from opaque_subclass.releases.schema import OPAQUE_OBJECT_API, ReleaseSupport
from opaque_subclass.releases.shared import FOREIGN_ISINSTANCE

#: The torch source files the fingerprints of this release's rows are read from, and their digests
#: (ReleaseSupport.sources): unchanged files are hashed at import, not parsed.
SOURCES = (
    # recorded on torch 2.13.0+cpu by tools/record_sources.py: do not edit by hand
    ("<fingerprints>", "81385294d68a3030"),
    ("_dynamo/convert_frame.py", "ca21a952feec8255"),
    ("_dynamo/guards.py", "882940c8d52d7e16"),
    ("_dynamo/variables/builder.py", "d05d046e77ed7fab"),
    ("_dynamo/variables/script_object.py", "6df0ec30283d4dee"),
    ("_dynamo/variables/tensor.py", "b919e7350f893bf5"),
    ("_export/non_strict_utils.py", "ffed1b37d143a2b1"),
    ("_functorch/_aot_autograd/autograd_cache.py", "c8581bdaa75922e3"),
    ("_functorch/_aot_autograd/runtime_wrappers.py", "efa73da320f9df6f"),
    ("_functorch/_aot_autograd/subclass_utils.py", "e1116f45ce271115"),
    ("_library/fake_class_registry.py", "14f12e8d9fec7e90"),
    ("_opaque_base.py", "a5a342950a1af6b4"),
    ("_subclasses/fake_tensor.py", "72a5c601389be918"),
    ("distributed/device_mesh.py", "acccb6b20491160b"),
    ("fx/experimental/proxy_tensor.py", "be14c189319501fc"),
    ("nn/utils/parametrize.py", "56a07942c8ee1125"),
)

RELEASE = ReleaseSupport(
    (2, 13),
    "native",
    OPAQUE_OBJECT_API,
    fixes=fix_rows((2, 13)),  # the table of fixes shared by releases: releases/fix_table.py
    limits=(FOREIGN_ISINSTANCE,),
    sources=SOURCES,
)
