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
from subclasses import Mesh, MeshTensor
from torch._functorch._aot_autograd import autograd_cache
from upstream_scenarios import (
    GLOBAL_TALLY,
    CarriedTallied,
    GlobalTallied,
    Tally,
    callable_value_opaque_on_an_intermediate_compiles,
    multiply,
    reference_opaque_made_while_tracing_is_named,
    tallied_outputs,
    untraced_scaled_sine,
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


def _dynamo_graph(x: torch.Tensor) -> torch.fx.GraphModule:
    """The graph Dynamo hands its backend for a checkpointed call of the untraced function."""
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(
            lambda t: torch.utils.checkpoint.checkpoint(untraced_scaled_sine, t, use_reentrant=False), backend=keep
        )(x)
    finally:
        torch._dynamo.reset()
    (gm,) = graphs
    return gm


def test_194658_subgraphs_are_checked_for_graphs_with_opaques_only():
    """pytorch/pytorch#194658 (every release; the full compilation is
    ``checkpointed_untraced_function_is_not_served_stale`` in test_fixes / test_backport): AOTAutograd's
    cacheability check refuses the untraced function in the checkpointed subgraph when the graph's
    input holds a mesh, naming the subgraph; for plain tensors it answers as torch does (code that does
    not use the library is unchanged: torch checks the top-level graph only)."""
    with_mesh = _dynamo_graph(MeshTensor(torch.ones(2), Mesh("a")).requires_grad_())
    with pytest.raises(
        autograd_cache.BypassAOTAutogradCache, match=r"^in the subgraph wrap_body_0: .*untraced_scaled_sine"
    ):
        autograd_cache.check_cacheable(with_mesh)
    plain = _dynamo_graph(torch.ones(2, requires_grad=True))
    assert autograd_cache.check_cacheable(plain) is None
