"""torch 2.12: native (pytorch/pytorch#176457), with fixes. Everything the library does on this release.

torch 2.12 handles opaque attributes itself. The library adds fixes: two bugs
that torch 2.13 fixed (``isinstance(obj, OpaqueBase)`` false for a registered
class that does not inherit it; ``ExportedProgram.module()`` and the ``.pt2``
archive dropping opaque constants: the 2.11 backport's replacements of the same
functions), and those of every native release: the AOTAutograd cache key that
ignores which inputs share one opaque, named errors at torch's entry points,
guarded member values of opaques, DTensor outputs on the mesh passed in.

What a row is, and how the set is applied: :mod:`opaque_subclass.releases`.
"""

from __future__ import annotations

from opaque_subclass.releases.fix_table import fix_rows
from opaque_subclass.releases.schema import OPAQUE_OBJECT_API, Difference, ReleaseSupport
from opaque_subclass.releases.shared import ATTRIBUTE_SOURCE_ENTRIES, ATTRIBUTE_SOURCE_TEXT, FOREIGN_ISINSTANCE

#: The torch source files the fingerprints of this release's rows are read from, and their digests
#: (ReleaseSupport.sources): unchanged files are hashed at import, not parsed.
SOURCES = (
    # recorded on torch 2.12.0+cu130 by tools/record_sources.py: do not edit by hand
    ("<fingerprints>", "1e182dd2a9029599"),
    ("_dynamo/convert_frame.py", "6ac6d2468a8471b1"),
    ("_dynamo/guards.py", "82346f2141628052"),
    ("_dynamo/variables/builder.py", "4078e9dd9b68e136"),
    ("_dynamo/variables/script_object.py", "fb1c909fba18bd41"),
    ("_dynamo/variables/tensor.py", "e73537540f5e52a8"),
    ("_export/non_strict_utils.py", "a2b044daec08a3f3"),
    ("_functorch/_aot_autograd/autograd_cache.py", "a2e517f85123a041"),
    ("_functorch/_aot_autograd/runtime_wrappers.py", "b64a44fe5afc6b5e"),
    ("_functorch/_aot_autograd/subclass_utils.py", "4870495de45b714f"),
    ("_library/fake_class_registry.py", "4df93aef5bac991e"),
    ("_opaque_base.py", "df542d181832f880"),
    ("_subclasses/fake_tensor.py", "0e4139b0f63ee0a4"),
    ("distributed/device_mesh.py", "cb5b063b6dc95ea9"),
    ("export/pt2_archive/_package.py", "b306a564f3d37e53"),
    ("export/unflatten.py", "2c8eb324ceb2a6c8"),
    ("fx/experimental/proxy_tensor.py", "b5a4a7e22ff09bca"),
    ("nn/utils/parametrize.py", "56a07942c8ee1125"),
)

RELEASE = ReleaseSupport(
    (2, 12),
    "native",
    OPAQUE_OBJECT_API,
    fixes=fix_rows((2, 12)),  # the table of fixes shared by releases: releases/fix_table.py
    differences=(
        Difference(ATTRIBUTE_SOURCE_TEXT, ATTRIBUTE_SOURCE_ENTRIES),
        Difference(
            "a compiled region that Dynamo compiles while an outer make_fx trace runs "
            "(torch._dynamo.config.force_compile_during_fx_trace, as torchtitan's graph trainer nests "
            "regions) guards an opaque input on the type of torch's fake wrapper (TYPE_MATCH): the outer "
            "trace compiles the region once more (3 compilations where 2.13 and newer need 2) with a "
            "recompile reason on the opaque; the outputs are right (pytorch/pytorch#179047, fixed in "
            "torch 2.13 by FAKE_SCRIPT_TYPE_MATCH)",
            ("upstream/179047-nested-compile-under-outer-trace",),
        ),
    ),
    limits=(
        FOREIGN_ISINSTANCE,
        "torch 2.12's CUDA build without a GPU may abort at interpreter exit ('terminate called "
        "without an active exception', exit 134) after threads that compiled have exited, with or "
        "without the library (4 of 6 runs of a 3-thread program): compile from one long-lived thread",
    ),
    sources=SOURCES,
)
