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

from opaque_subclass.releases.schema import OPAQUE_OBJECT_API, Difference
from opaque_subclass.releases.shared import ATTRIBUTE_SOURCE_ENTRIES, ATTRIBUTE_SOURCE_TEXT, native_release

RELEASE = native_release(
    (2, 12),
    OPAQUE_OBJECT_API,
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
        "torch 2.12's CUDA build without a GPU may abort at interpreter exit ('terminate called "
        "without an active exception', exit 134) after threads that compiled have exited, with or "
        "without the library (4 of 6 runs of a 3-thread program): compile from one long-lived thread",
    ),
)
