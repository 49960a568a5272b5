"""Scenarios of upstream torch bugs the library fixes or names
(docs/compatibility.md, "Upstream's own bugs in this feature").

Each scenario asserts what a user should see and, where it guards against a
wrong result, says what it found: ``tests/test_fixes.py`` suspends the fix and
matches that message (the ``*_FAILURE`` records, measured on each release);
``tests/test_upstream_bugs.py`` runs the scenarios with the library on.
"""

from __future__ import annotations

import torch
from scenarios import StockFailure, fresh_inductor_cache
from subclasses import Config, Mesh, MeshTensor

__all__ = [
    "VALUE_OPAQUE_OUTPUT_FAILURE",
    "value_opaque_beside_subclass_output_survives_the_caches",
]


def value_opaque_beside_subclass_output_survives_the_caches() -> None:
    """pytorch/pytorch#193190: ``f(x) = (x * 2, Config(7))`` with ``x`` a
    subclass, compiled with inductor, then compiled again in the same process
    and served from AOTAutograd's and inductor's caches (Dynamo reset,
    inductor's loaded modules forgotten; a fresh cache directory for the two).
    Both times the function returns the real ``Config(7)``."""
    from torch._dynamo.utils import counters
    from torch._inductor.codecache import PyCodeCache

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, Config]:
        return x * 2, Config(7)

    with fresh_inductor_cache():
        for attempt in ("compiled", "loaded from the caches"):
            torch._dynamo.reset()
            counters.clear()
            PyCodeCache.cache_clear()  # the second compilation loads the graph from the disk cache
            mesh = Mesh("a")
            out, config = torch.compile(fn, backend="inductor", fullgraph=True)(MeshTensor(torch.ones(2), mesh))
            assert out._mesh is mesh and out._data.tolist() == [2.0, 2.0], attempt
            served = counters["aot_autograd"]["autograd_cache_hit"] > 0
            assert served == (attempt != "compiled"), f"{attempt}: served from AOTAutograd's cache: {served}"
            # torch's fake wrapper passes isinstance(x, Config): compare the exact type
            assert type(config) is Config and config.bits == 7, (
                f"{attempt}: returned {type(config).__name__}, expected Config(7)"
            )
    torch._dynamo.reset()


#: With the fix of ``subclass_utils.unwrap_tensor_subclasses`` suspended (torch
#: 2.12 - 2.14): the first compilation returns torch's fake wrapper on 2.12 and
#: 2.13; on 2.14 it is right, and the graph loaded from the caches returns None.
VALUE_OPAQUE_OUTPUT_FAILURE = {
    (2, 12): StockFailure(AssertionError, r"^compiled: returned FakeScriptObject, expected Config\(7\)$"),
    (2, 13): StockFailure(AssertionError, r"^compiled: returned FakeScriptObject, expected Config\(7\)$"),
    (2, 14): StockFailure(AssertionError, r"^loaded from the caches: returned NoneType, expected Config\(7\)$"),
}
