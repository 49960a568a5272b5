"""Upstream torch bugs in opaque objects, with the library on (issue #36; the
table: docs/compatibility.md, "Upstream's own bugs in this feature").

Each test runs what a user would write and checks that the library's answer
holds on the running release: the right result where the library installs a
fix (``tests/test_fixes.py`` shows the fix is needed: with it suspended the
same scenario fails as recorded), or the library's named error where a fix is
not sound. The scenarios: ``tests/upstream_scenarios.py``.
"""

from __future__ import annotations

import pytest
import torch
from upstream_scenarios import (
    GLOBAL_TALLY,
    CarriedTallied,
    GlobalTallied,
    Tally,
    callable_value_opaque_on_an_intermediate_compiles,
    multiply,
    reference_opaque_made_while_tracing_is_named,
    tallied_outputs,
    value_opaque_beside_subclass_output_survives_the_caches,
)

from opaque_subclass.releases import current

ROW = current()


@pytest.mark.skipif(
    ROW.release < (2, 12),
    reason="torch 2.11's Dynamo cannot return a value opaque built in the region (a listed difference)",
)
def test_193190_value_opaque_beside_subclass_output():
    """pytorch/pytorch#193190 (fixed upstream in torch 2.15; the library's fix
    on 2.12 - 2.14): the value opaque comes back real, compiled and from the caches."""
    value_opaque_beside_subclass_output_survives_the_caches()


def test_176044_reference_opaque_made_while_tracing_is_named():
    """pytorch/pytorch#176044 (every release): a reference opaque made in
    ``__torch_dispatch__`` while torch traces is refused by name, not compiled
    in as a constant every call shares."""
    reference_opaque_made_while_tracing_is_named()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_176044_reference_opaques_made_before_the_trace_compile(backend):
    """The refusal is about objects made while tracing only: a Tally carried as
    an attribute (a graph input: each call's own) and a module-level Tally read
    below Dynamo (torch compiles it in; eager uses that same object) compile
    and give eager's outputs."""

    def carried():
        return CarriedTallied(torch.ones(2), Tally()), CarriedTallied(torch.full((2,), 2.0), Tally())

    def global_():
        return GlobalTallied(torch.ones(2)), GlobalTallied(torch.full((2,), 2.0))

    for make in (carried, global_):
        torch._dynamo.reset()
        GLOBAL_TALLY.count = 0
        eager = tallied_outputs(multiply, make)
        GLOBAL_TALLY.count = 0
        compiled = torch.compile(multiply, backend=backend, fullgraph=True)
        assert tallied_outputs(compiled, make) == eager, make.__name__
    assert eager == [[2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]  # the global one counts every call
    torch._dynamo.reset()


@pytest.mark.skipif(
    ROW.release < (2, 12),
    reason="torch 2.11: the method call is a graph break still (a listed difference)",
)
def test_188796_callable_value_opaque_on_an_intermediate():
    """pytorch/pytorch#188796 (fixed upstream in torch 2.15; the library's fix
    on 2.12 - 2.14): one graph, eager's values."""
    callable_value_opaque_on_an_intermediate_compiles()


def test_176044_non_strict_export_of_a_forward_making_one_is_named():
    """The same under non-strict ``torch.export``: a forward that makes a
    reference opaque and passes it to a custom op is refused by name (stock:
    exported with the object compiled in, calls count 1, 2, 3 where eager
    gives 1, 1, 1; strict export and Dynamo refuse it themselves)."""
    from opaque_subclass.fixes.traced_opaques import OpaqueCreatedWhileTracingError

    class MakesOne(torch.nn.Module):
        def forward(self, x):
            return torch.ops.osc_upstream.tally_scale(x, Tally())

    with pytest.raises(OpaqueCreatedWhileTracingError, match=r"^a reference opaque upstream_scenarios\.Tally "):
        torch.export.export(MakesOne(), (torch.ones(2),), strict=False)
