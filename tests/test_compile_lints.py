"""compile_passes: explain(), the lints (OSC001-OSC005) and the opaque_check backend, on every leg;
each lint's fix executed as written on its own example."""

from __future__ import annotations

import inspect
import logging
import re
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from subclasses import (
    Config,
    Mesh,
    MeshTensor,
    ShardLike,
    ShardSpec,
    SummedOverGroup,
    ValueMesh,
    _Wrapper,
    registered_mesh_world_of_one,
)

import compile_passes as cp
import opaque_subclass as osc
from opaque_subclass import OpaqueSubclass


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _codes(findings):
    return [f.code for f in findings]


class Outer(_Wrapper):
    INNER = ("_data",)


class IdentityHandle:
    """No __eq__: compared by identity."""


class Quantized(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_cfg", "_bits")


class MeshInMeta(OpaqueSubclass):
    tensor_attrs = ("_data",)
    meta_attrs = ("_mesh",)


# ------------------------------------------------------------------ OSC001


def test_mesh_in_a_context_spec_is_found_and_goes_stale():
    """The ShardTensor shape: the mesh inside a spec in the context. The finding's
    claim holds: an equal mesh over another group runs with the first one."""
    a, b = ValueMesh(2, "group-a"), ValueMesh(2, "group-b")
    report = cp.explain(lambda x: x * 2, ShardLike(torch.ones(2), ctx=ShardSpec(a, 0)))
    (finding,) = report.findings
    assert finding.code == "OSC001" and finding.severity == "error"
    assert finding.subclass == "subclasses.ShardLike" and finding.path == "x.<context>.mesh"
    assert "holds subclasses.ValueMesh, a registered reference opaque" in finding.message
    assert "inside a subclasses.ShardSpec whose == decides the guard" in finding.message
    assert "runs with the first call's object" in finding.message
    assert "ShardLike.__tensor_flatten__" in finding.fix
    assert "OSC001 (error) x.<context>.mesh" in str(report)

    f = torch.compile(lambda x: x * 2, backend="aot_eager")
    assert f(ShardLike(torch.ones(2), ctx=ShardSpec(a, 0))).spec.mesh is a
    stale = f(ShardLike(torch.ones(2), ctx=ShardSpec(b, 0))).spec.mesh
    assert stale is a  # torch's behaviour, which the finding describes


def test_identity_compared_object_in_context_is_found_and_refused_before_tracing():
    handle = IdentityHandle()
    x = ShardLike(torch.ones(2), ctx=(handle, 3))
    # The lint, on the value itself.
    (finding,) = cp.lint_contexts(x, "x")
    assert finding.path == "x.<context>[0]" and "compared by identity (its class defines no __eq__)" in finding.message
    assert "Guard failed on the same frame it was created" in finding.message  # what stock torch says
    assert "register_opaque(IdentityHandle)" in finding.fix
    # Compiled, the library refuses the input where Dynamo meets it (stock torch
    # crashed after tracing), so no graph is linted: the report holds the error,
    # and next to it the finding on the argument that explains it.
    report = cp.explain(lambda x: x + 1, x)
    assert report.graphs == [] and [f.path for f in report.findings] == ["x.<context>[0]"]
    (error,) = report.errors
    assert "ShardLike.__tensor_flatten__() at \"L['x']\" returns a flatten context whose <context>[0] holds " in error
    assert "test_compile_lints.IdentityHandle, which is not equal to a copy of itself" in error and "Fix:" in error, (
        error
    )


def test_the_context_fix_uses_the_subclass_attribute_names():
    """#26 item 5: OSC001's fix lists what the subclass's own __tensor_flatten__
    returns plus the attribute that holds the object (by identity), not a
    template's names."""
    handle = IdentityHandle()
    x = ShardLike(torch.ones(2), ctx=(handle, 3))
    x._handle = handle  # held as an attribute too, but listed only in the context
    (finding,) = cp.lint_contexts(x, "x")
    assert "hold it as self._handle, return ['_local', '_handle'] from ShardLike.__tensor_flatten__" in finding.fix
    assert "inner_tensors['_handle']" in finding.fix and "'_mesh'" not in finding.fix


def test_input_check_and_lint_name_the_same_object_inside_a_spec():
    """The input check and the lint walk a context alike (core.context): with an
    identity-compared handle inside a value-compared spec, both name the handle
    at ``<context>[0].mesh``, not the spec, whose __eq__ is fine."""
    x = ShardLike(torch.ones(2), ctx=(ShardSpec(IdentityHandle(), 0),))
    (finding,) = cp.lint_contexts(x, "x")
    assert finding.path == "x.<context>[0].mesh"
    assert "inside a subclasses.ShardSpec whose == decides the guard" in finding.message
    (error,) = cp.explain(lambda x: x + 1, x).errors
    assert "returns a flatten context whose <context>[0].mesh holds test_compile_lints.IdentityHandle" in error, error
    assert "Fix: register its class, `import opaque_subclass; from test_compile_lints import IdentityHandle;" in error
    assert "or, if it is a constant, give IdentityHandle value equality: define `def __eq__" in error, error


def test_nested_and_opaque_subclass_meta_attr():
    # Value-compared meshes (ValueMesh, == by layout as DeviceMesh's): compiled,
    # traced, and linted in the graph. An identity-compared one is refused before
    # tracing (test above).
    inner = ShardLike(torch.ones(2), ctx=(ValueMesh(2, "inner"),))
    report = cp.explain(lambda x: x * 2, Outer(inner, ctx=None))
    assert [(f.code, f.path, f.subclass) for f in report.findings] == [
        ("OSC001", "x._data.<context>[0]", "subclasses.ShardLike")
    ]
    meta = cp.explain(lambda x: x * 2, MeshInMeta(torch.ones(2), ValueMesh(2, "m")))
    (finding,) = meta.findings
    assert finding.path == "x.<context>[0]"
    assert "declare '_mesh' in MeshInMeta.opaque_attrs = {'_mesh': ValueMesh}" in finding.fix
    spec = cp.explain(lambda x: x * 2, MeshInMeta(torch.ones(2), ShardSpec(ValueMesh(2, "m"), 0)))
    (finding,) = spec.findings
    assert finding.path == "x.<context>[0].mesh"
    assert "take the ValueMesh out of the metadata attribute '_mesh'" in finding.fix


def test_no_false_positives_on_opaque_attributes_and_value_contexts():
    m = Mesh("m")
    cases = [
        MeshTensor(torch.ones(2), m),  # the opaque is an attribute: an input
        Quantized(torch.ones(2), m, Config(4), 8),  # value opaque and an int in the context
        ShardLike(torch.ones(2), ctx=("row", 3, torch.float32, (1, 2), {"k": None})),
        Outer(MeshTensor(torch.ones(2), m), ctx=ShardSpec(None, 0)),
    ]
    for value in cases:
        torch._dynamo.reset()
        report = cp.explain(lambda x: x * 2, value)
        assert report.findings == [], (type(value), report.findings)
        assert report.errors == []


# ------------------------------------------------------------------ OSC003 and recompiles


def test_shared_opaque_is_reported_and_its_recompile_translated():
    m = Mesh("shared")
    a, b = MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), m)
    report = cp.explain(lambda x, y: x + y, a, b)
    (finding,) = report.findings
    assert (finding.code, finding.severity, finding.path) == ("OSC003", "info", "x._mesh, y._mesh")
    assert "guarded on it (x._mesh is y._mesh)" in finding.message
    report.call(a, MeshTensor(torch.ones(2), Mesh("other")))
    (recompile,) = report.recompiles
    assert (
        recompile.reason
        == "inputs `x._mesh` and `y._mesh` no longer share one object (the graph was compiled for one shared object)"
    )
    assert "x._mesh is y._mesh" in recompile.guard
    assert len(report.graphs) == 2 and "recompilations" in str(report)


def test_sharing_is_reported_per_pair_of_distinct_paths_and_a_repeated_path_is_not_sharing():
    """#26 item 3: a path that reaches the graph twice is one input; three
    inputs holding one object give one finding per pair."""
    m = Mesh("shared")
    assert cp.lint_sharing(cp.guards.sharing_report([("x._g", m), ("x._g", m)])) == []
    findings = cp.lint_sharing(cp.guards.sharing_report([("x._g", m), ("y._g", m), ("x._g", m), ("z._g", m)]))
    assert [f.path for f in findings] == ["x._g, y._g", "x._g, z._g", "y._g, z._g"]
    assert all(f.code == "OSC003" and f.path.count("x._g") <= 1 for f in findings)
    assert "guarded on it (y._g is z._g)" in findings[2].message


def test_module_parameters_sharing_one_mesh_is_not_reported():
    """Every parameter of a sharded model holds the model's mesh: module state,
    the same on every call, not reported; an argument sharing it still is."""
    m = Mesh("shared")
    report = cp.guards.sharing_report([("self.w1", m), ("self.w2", m), ("x._g", m)])
    findings = cp.lint_sharing(report, frozenset({"self.w1", "self.w2"}))
    assert [f.path for f in findings] == ["self.w1, x._g", "self.w2, x._g"]
    assert len(cp.lint_sharing(report)) == 3


def test_the_sharing_fix_runs_as_written():
    """#26 item 5: OSC003's fix gives the second input an object of its own,
    in the program's names; executed as written, the next compilation has no
    sharing to report."""
    m = Mesh("shared")
    a, b = MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), m)
    (finding,) = cp.explain(lambda x, y: x + y, a, b).findings
    (code,) = re.findall(r"give it one before the call: `([^`]+)`", finding.fix)
    assert code == "import copy; y._mesh = copy.copy(y._mesh)"
    exec(code, {"y": b})
    assert b._mesh is not m and isinstance(b._mesh, Mesh)
    torch._dynamo.reset()
    assert cp.explain(lambda x, y: x + y, a, b).findings == []


def test_the_sharing_fix_of_a_process_group_makes_a_new_group():
    from subclasses import GroupTensor, fake_world

    with fake_world(4):
        group = dist.new_group([0, 1])
        a, b = GroupTensor(torch.ones(2), group), GroupTensor(torch.ones(2), group)
        (finding,) = cp.lint_sharing(cp.guards.sharing_report([("x", a), ("y", b)]))
        (code,) = re.findall(r"give it one before the call: `([^`]+)`", finding.fix)
        exec(code, {"y": b})
        assert b._group is not group and dist.get_process_group_ranks(b._group) == [0, 1]
        assert cp.lint_sharing(cp.guards.sharing_report([("x", a), ("y", b)])) == []


def test_distinct_opaques_have_no_sharing_finding():
    report = cp.explain(lambda x, y: x + y, MeshTensor(torch.ones(2), Mesh("a")), MeshTensor(torch.ones(2), Mesh("b")))
    assert report.findings == []
    assert [i.path for i in report.graphs[0].inputs.opaques] == ["x._mesh", "y._mesh"]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("0/0: x._mesh is y._mesh   # def f(x, y): ...", "inputs `x._mesh` and `y._mesh` no longer share one object"),
        ("1/0: L['x']._mesh is not L['y']._mesh", "inputs `x._mesh` and `y._mesh` now share one object"),
        ("0/0: ___check_obj_id(L['m'], 140234)", "`m` is not the object the graph was compiled with"),
        ("0/0: ___check_metadata_1402_c0/0   # x", "a subclass input's flatten context differs (by ==)"),
        ("1/0: ___check_constant_flatten_1402   # x", "a subclass class's __tensor_flatten__ is no longer the one"),
        ("0/0: tensor 'x' size mismatch at index 0", "tensor 'x' size mismatch at index 0"),
        # member values read at compile time (#26 item 4): the same text whichever way torch writes them
        ("2/0: L['t']._group.size() == 4", "`t._group.size()` is no longer 4: the graph was compiled with that value"),
        ("0/0: t._gauge.offset == 1   # r = ...", "`t._gauge.offset` is no longer 1: the graph was compiled"),
        ("1/0: object.__getattribute__(t._gauge, 'offset') == 1", "`t._gauge.offset` is no longer 1: the graph"),
        ("3/0: L['x8']._group.group_name == '1'", "`x8._group.group_name` is no longer '1'"),
    ],
)
def test_translate_guard(reason, expected):
    assert cp.translate_guard(reason).startswith(expected)


def test_a_group_name_guard_says_it_costs_a_compilation_per_group():
    said = cp.translate_guard("3/0: object.__getattribute__(L['x8']._group, 'group_name') == '1'")
    assert "`x8._group` is another process group than the graph's" in said
    assert "one compilation per group" in said


def test_an_untranslated_guard_names_the_input_it_concerns():
    said = cp.translate_guard("0/0: ___some_new_check(L['x']._mesh._rank_map, 3)   # x")
    assert said == "___some_new_check(x._mesh._rank_map, 3) (a guard on input `x._mesh._rank_map`)"


@pytest.mark.parametrize(
    ("fn", "first", "second", "expected"),
    [
        (lambda t: t._data * t._gauge.factor(), (2, 0), (3, 0), "`t._gauge.factor()` is no longer 2"),
        (lambda t: t._data + t._gauge.offset, (2, 1), (2, 5), "`t._gauge.offset` is no longer 1"),
    ],
    ids=["method", "attribute"],
)
def test_member_recompiles_are_translated_on_every_release(fn, first, second, expected):
    from subclasses import Gauge, GaugeTensor

    report = cp.explain(fn, GaugeTensor(torch.ones(2), Gauge(*first)))
    report.call(GaugeTensor(torch.ones(2), Gauge(*second)))
    (recompile,) = report.recompiles
    assert recompile.reason.startswith(expected), recompile.reason


def test_a_compilation_that_fails_on_a_context_is_explained_by_its_finding():
    """#26 item 6: a real communicator in a flatten context stops the
    compilation (the library's named error, recorded in ``errors``); the
    OSC001 finding that explains it is reported next to it, from the
    arguments, though no graph was made."""
    from subclasses import fake_world

    with fake_world(2) as world:

        def double(x):
            return x * 2

        report = cp.explain(double, ShardLike(torch.ones(2), ctx=ShardSpec(world, 0)))
        assert report.graphs == []
        (error,) = report.errors
        assert error.startswith("OpaqueTypeError:") and "ProcessGroup" in error
        (finding,) = report.findings
        assert (finding.code, finding.path) == ("OSC001", "x.<context>.mesh")
        assert "findings" in str(report) and "errors" in str(report)


# ------------------------------------------------------------------ OSC005


def test_a_collective_on_a_group_named_by_a_constant_is_reported():
    """#26 item 2: torch's functional all_reduce on a subclass's group records
    the group's name as a constant of the graph: one finding, with the op, the
    group, its ranks, the user's line and the recipe."""
    import torch.distributed._functional_collectives as fc
    from subclasses import GroupTensor, fake_world

    with fake_world(4):
        group = dist.new_group([0, 1])
        report = cp.explain(
            lambda t: fc.all_reduce(t._data, "sum", t._group) * 2,  # the line the finding names
            GroupTensor(torch.ones(2), group),
        )
        (finding,) = [f for f in report.findings if f.code == "OSC005"]
        assert finding.severity == "warning" and finding.path == "t._group"
        assert (
            f"_c10d_functional.all_reduce on process group {group.group_name!r} (ranks [0, 1] here)" in finding.message
        )
        assert f"Dynamo guards its name (`t._group.group_name == {group.group_name!r}`)" in finding.message
        assert "test_compile_lints.py:" in finding.message and "fc.all_reduce(t._data" in finding.message
        assert "custom op that takes the group as an opaque input" in finding.fix and "Recipe" in finding.fix
        assert 'replace `fc.all_reduce(t._data, "sum", t._group)` with `all_reduce_sum(t._data, t._group)`' in (
            finding.fix
        )
        assert cp.CODES["OSC005"][0] == "warning"


def test_a_collective_taking_the_group_as_an_input_is_not_reported():
    """The recipe's shape: a custom op whose schema takes the group; the graph
    holds no group name."""
    from subclasses import GroupTensor, fake_world

    with fake_world(2) as world:

        @torch.library.custom_op("osc_lints::group_sum", mutates_args=())
        def group_sum(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
            return x.clone()

        @group_sum.register_fake
        def _(x, group):
            return torch.empty_like(x)

        report = cp.explain(lambda t: group_sum(t._data, t._group) * 2, GroupTensor(torch.ones(2), world))
        assert [f.code for f in report.findings if f.code == "OSC005"] == []
        assert len(report.graphs) == 1


def gathered_twice(x):
    from torch.distributed.tensor import Replicate

    return x.redistribute(x.device_mesh, [Replicate()]).to_local() * 2


def test_a_collective_issued_below_dynamo_is_reported_when_watched():
    """#26 item 7: DTensor's redistribution issues its all-gather while
    AOTAutograd traces (Dynamo's graph holds only the DTensor op): OSC005 from
    the watcher of the inner compilation, naming the issuer and the user's
    line; the backend that does not watch does not see it."""
    from subclasses import fake_world
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    with fake_world(2):
        x = distribute_tensor(torch.arange(4.0), init_device_mesh("cpu", (2,)), [Shard(0)])
        report = cp.explain(gathered_twice, x)
        (finding,) = [f for f in report.findings if f.code == "OSC005"]
        assert finding.path == "graph 0:_c10d_functional.all_gather_into_tensor"
        assert "process group '0' (ranks [0, 1] here), issued below Dynamo by torch.distributed.tensor." in (
            finding.message
        )
        assert "in gathered_twice: return x.redistribute(x.device_mesh, [Replicate()]).to_local() * 2" in (
            finding.message
        )
        assert "inside `with opaque_subclass.dtensor.share_compiles():`" in finding.fix  # torch's DTensor issued it
        assert report.errors == [] and len(report.graphs) == 1  # (a fake group gathers nothing real)
        torch._dynamo.reset()
        checks = []
        torch.compile(gathered_twice, backend=cp.checking_backend("aot_eager", "record", on_check=checks.append))(x)
        assert [f.code for c in checks for f in c.findings if f.code == "OSC005"] == []


def amax_over_group(t):
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(t._data.abs().amax(), "max", t._group)


def test_the_collective_fix_runs_as_written():
    """#26 item 5: OSC005's fix is a custom op for the program's all_reduce on
    its group and the call it replaces; applied, the graph names no group and
    computes the same."""
    from subclasses import GroupTensor, fake_world

    with fake_world(4):
        group = dist.new_group([0, 1])
        x = GroupTensor(torch.tensor([1.0, -3.0]), group)
        report = cp.explain(amax_over_group, x)
        (finding,) = [f for f in report.findings if f.code == "OSC005"]
        assert 'replace `funcol.all_reduce(t._data.abs().amax(), "max", t._group)` with ' in finding.fix
        assert "`all_reduce_max(t._data.abs().amax(), t._group)`" in finding.fix
        namespace = _applied(amax_over_group, finding.fix, {**globals(), **_fix_code(finding.fix)})
        torch._dynamo.reset()
        fixed = cp.explain(namespace["amax_over_group"], x)
        assert fixed.findings == [] and fixed.errors == []
        assert fixed.outputs.item() == report.outputs.item() == 3.0


def reduced_in_place(t):
    x = t._data.clone()
    dist.all_reduce(x, group=t._group)
    return x * 2


def test_dist_all_reduce_on_a_group_attribute_is_one_finding_for_every_group():
    """#36 item 4: ``dist.all_reduce(x, group=t._group)`` compiled for two
    groups: one OSC005 naming both groups, the opaque the group came from and
    the guard Dynamo holds on its name (from the compilation's own guards); its
    fix, applied as written, gives one graph for both groups."""
    from subclasses import GroupTensor, fake_world

    with fake_world(4):
        a, b = dist.new_group([0, 1]), dist.new_group([0, 2, 3])
        report = cp.explain(reduced_in_place, GroupTensor(torch.ones(2), a))
        report.call(GroupTensor(torch.ones(2), b))
        assert len(report.graphs) == 2 and report.errors == []
        (finding,) = [f for f in report.findings if f.code == "OSC005"]
        assert finding.path == "t._group" and finding.severity == "warning"
        assert f"process groups {a.group_name!r} (ranks [0, 1] here), {b.group_name!r} (ranks [0, 2, 3] here)" in (
            finding.message
        )
        assert f"Dynamo guards its name (`t._group.group_name == {a.group_name!r}`)" in finding.message
        assert "one compilation per group (2 so far)" in finding.message
        assert "replace `dist.all_reduce(x, group=t._group)` with `x.copy_(all_reduce_sum(x, t._group))`" in finding.fix
        namespace = _applied(reduced_in_place, finding.fix, {**globals(), **_fix_code(finding.fix)})
        torch._dynamo.reset()
        fixed = cp.explain(namespace["reduced_in_place"], GroupTensor(torch.ones(2), a))
        fixed.call(GroupTensor(torch.ones(2), b))
        assert fixed.findings == [] and fixed.errors == [] and len(fixed.graphs) == 1


def gathered(t):
    import torch.distributed._functional_collectives as funcol

    return funcol.all_gather_tensor(t._data, 0, t._group) + 1


def scattered(t):
    import torch.distributed._functional_collectives as funcol

    return funcol.reduce_scatter_tensor(t._data, "sum", 0, t._group) * 3


@pytest.mark.parametrize("program", [gathered, scattered], ids=["all_gather_tensor", "reduce_scatter_tensor"])
def test_the_fix_of_a_gather_or_a_scatter_runs_as_written(program):
    """#36 item 4: OSC005's fix for torch's functional all-gather and
    reduce-scatter on a group attribute is a custom op taking the group and its
    size (read in the compiled function, guarded), in the user's names; applied,
    one graph serves two groups of one size and gives the shapes torch's does."""
    import warnings

    from subclasses import GroupTensor, fake_world

    with fake_world(4), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # reduce_scatter_tensor's deprecation (2.15)
        a, b = dist.new_group([0, 1]), dist.new_group([0, 2])
        x = GroupTensor(torch.ones(4, 2), a)
        report = cp.explain(program, x)
        (finding,) = [f for f in report.findings if f.code == "OSC005"]
        assert f"{program.__name__}" in finding.message and "t._group.size())`" in finding.fix
        namespace = _applied(program, finding.fix, {**globals(), **_fix_code(finding.fix)})
        torch._dynamo.reset()
        fixed = cp.explain(namespace[program.__name__], x)
        fixed.call(GroupTensor(torch.ones(4, 2), b))
        # what remains is the guarded read of the group's size (one compilation per size): info
        assert [(f.code, f.severity, f.path) for f in fixed.findings] == [("OSC004", "info", "t._group.size()")]
        assert fixed.errors == [] and len(fixed.graphs) == 1
        assert fixed.outputs.shape == report.outputs.shape


def doubled(t):
    return (t * 2)._data


def test_a_collective_below_dynamo_on_an_unguarded_group_is_an_error_with_the_users_fix():
    """#36 item 4: a subclass's ``__torch_dispatch__`` all-reduces over its
    group attribute while AOTAutograd traces: the graph names the group by a
    constant and nothing guards it (a second group runs the first group's
    graph, no recompilation). OSC005 says so as an error, once (the read of the
    group's name is reported with it, not as an OSC004 of its own), names the
    dispatch line, and its fix rewrites that line; applied, the graph takes the
    group as an input. torch 2.11 fails to compile the program (its fake
    wrapper of the group answers no member: the release table lists it)."""
    from subclasses import fake_world

    from opaque_subclass.releases import current

    with fake_world(4):
        a, b = dist.new_group([0, 1]), dist.new_group([0, 2, 3])
        report = cp.explain(doubled, SummedOverGroup(torch.ones(2), a))
        report.call(SummedOverGroup(torch.ones(2), b))
        (finding,) = [f for f in report.findings if f.code == "OSC005"]
        assert "issued below Dynamo by subclasses (" in finding.message
        replaced = 'replace `funcol.all_reduce(r, "sum", g)` with `all_reduce_sum(r, g)`'
        assert replaced in finding.fix
        if current().release == (2, 11):
            assert report.errors and all("BackendCompilerFailed" in e for e in report.errors)
            return
        assert report.errors == [] and len(report.graphs) == 1 and report.recompiles == []
        assert finding.severity == "error" and finding.path == "t._group"
        assert "nothing guards it: a later call whose t._group is another group runs this graph on" in finding.message
        # #35 item 3: the other way out, the rewrite that takes the group from the input
        assert "share_compiles():` (torch 2.12 - 2.15" in finding.fix
        assert "takes its group from `t._group`, a graph input" in finding.fix
        assert [f for f in report.findings if f.code == "OSC004"] == []
        namespace = _applied(SummedOverGroup, finding.fix, {**globals(), **_fix_code(finding.fix)})
        torch._dynamo.reset()
        fixed = cp.explain(doubled, namespace["SummedOverGroup"](torch.ones(2), a))
        fixed.call(namespace["SummedOverGroup"](torch.ones(2), b))
        assert [f.code for f in fixed.findings] == [] and fixed.errors == [] and len(fixed.graphs) == 1


def test_the_backend_reports_a_finding_once_not_once_per_graph():
    """#36 item 4: the checking backend warns once per finding: the same
    collective compiled again for another group (a recompilation) is not
    reported again."""
    from subclasses import GroupTensor, fake_world

    with fake_world(4):
        a, b = dist.new_group([0, 1]), dist.new_group([0, 2, 3])
        compiled = torch.compile(reduced_in_place, backend=cp.checking_backend("aot_eager", "warn"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled(GroupTensor(torch.ones(2), a))
            compiled(GroupTensor(torch.ones(2), b))
        said = [w for w in caught if issubclass(w.category, cp.OpaqueCheckWarning) and "OSC005" in str(w.message)]
        assert len(said) == 1, [str(w.message) for w in said]


# ------------------------------------------------------------------ OSC004

_FIX_NAMESPACES: dict[str, dict] = {}


def _fix_code(fix: str) -> dict:
    """Execute the code block of a finding's fix (once per process: the custom
    op it defines can be defined once) and return its namespace."""
    (code,) = re.findall(r"```\n(.*?)\n```", fix, re.S)
    if code not in _FIX_NAMESPACES:
        namespace: dict = {}
        exec(code, namespace)
        _FIX_NAMESPACES[code] = namespace
    return _FIX_NAMESPACES[code]


def _replacements(fix: str) -> list[tuple[str, str]]:
    return re.findall(r"replace `([^`]+)` with `([^`]+)`", fix)


def _applied(obj, fix: str, namespace: dict) -> dict:
    """Apply the fix's replacements to the source of ``obj`` (each replaced text
    must occur in it exactly once) and execute it in ``namespace``."""
    source = inspect.getsource(obj)
    for old, new in _replacements(fix):
        if old in source:
            assert source.count(old) == 1, (old, source)
            source = source.replace(old, new)
    exec(source, namespace)
    return namespace


def _osc004(report):
    return [f for f in report.findings if f.code == "OSC004"]


def test_a_member_read_below_dynamo_is_an_unguarded_error():
    """#26 item 1, the issue's program: a Float8-like subclass's
    __torch_dispatch__ divides by its group's size() read on the real group
    while AOTAutograd traces. Nothing guards it: an error naming the member,
    the input, the user's line and a fix, on every release."""
    import subclasses
    from subclasses import GroupScaled, fake_world

    with fake_world(4) as world:
        pair = dist.new_group([0, 1])
        report = cp.explain(lambda t: (t * 2)._data, GroupScaled(torch.ones(2), pair))
        (finding,) = _osc004(report)
        assert (finding.severity, finding.path, finding.subclass) == (
            "error",
            "t._group.size()",
            "subclasses.GroupScaled",
        )
        assert "`g.size()` (t._group) is evaluated on the real ProcessGroup while the graph is traced below Dynamo" in (
            finding.message
        )
        assert f"{subclasses.__file__}:" in finding.message and "in __torch_dispatch__: n = g.size()" in finding.message
        assert "and 2 is compiled into the graph with no guard" in finding.message
        assert "replace `g.size()` with `processgroup_size(g)`" in finding.fix
        (read,) = [r for graph in report.graphs for r in graph.reads]
        assert (read.stage, read.value, read.guarded) == ("below dynamo", 2, False)
        if osc.support().mode == "native":
            # the claim, checked: compiled for a group of 2, a group of 4 still divides by 2
            torch._dynamo.reset()
            compiled = torch.compile(lambda t: (t * 2)._data, backend="aot_eager")
            assert compiled(GroupScaled(torch.ones(2), pair)).tolist() == [1.0, 1.0]
            assert compiled(GroupScaled(torch.ones(2), world)).tolist() == [1.0, 1.0]  # 0.5 in eager
        else:  # torch 2.11 refuses size() on its fake wrapper: the compilation fails, explained by the finding
            assert report.errors and report.errors[0].startswith("BackendCompilerFailed")


def test_the_fix_of_a_read_below_dynamo_runs_as_written():
    """#26 item 5: the fix's custom op, defined as written, replaces the read
    in the subclass's source; compiled again, nothing is reported and each
    call divides by its own group's size."""
    import subclasses
    from subclasses import GroupScaled, fake_world

    with fake_world(4) as world:
        pair = dist.new_group([0, 1])
        (finding,) = _osc004(cp.explain(lambda t: (t * 2)._data, GroupScaled(torch.ones(2), pair)))
        namespace = _applied(GroupScaled, finding.fix, {**vars(subclasses), **_fix_code(finding.fix)})
        fixed = namespace["GroupScaled"]
        torch._dynamo.reset()
        report = cp.explain(lambda t: (t * 2)._data, fixed(torch.ones(2), pair))
        assert report.findings == [] and report.errors == []
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: (t * 2)._data, backend="aot_eager")
        assert compiled(fixed(torch.ones(2), pair)).tolist() == [1.0, 1.0]
        assert compiled(fixed(torch.ones(2), world)).tolist() == [0.5, 0.5]


class GroupNamed(_Wrapper):
    """Adds the length of its group's name to every result, read in
    __torch_dispatch__ (an attribute, a pybind11 property of ProcessGroup)."""

    INNER = ("_data",)
    OPAQUES = ("_group",)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        proto = next(a for a in args if isinstance(a, cls))
        k = len(proto._group.group_name)
        out = func(*[a._data if isinstance(a, cls) else a for a in args], **(kwargs or {}))
        return cls(out + k, proto._group)


def test_an_attribute_read_below_dynamo_is_seen_through_torchs_wrapper():
    """group_name (no profiling event on the real object) is seen when
    AOTAutograd's later passes read it through torch's fake wrapper; a string:
    the fix says where to read it instead."""
    from subclasses import fake_world

    with fake_world(4):
        group = dist.new_group([0, 1])
        (finding,) = _osc004(cp.explain(lambda t: (t * 2)._data, GroupNamed(torch.ones(2), group)))
        assert (finding.severity, finding.path) == ("error", "t._group.group_name")
        assert "`proto._group.group_name` (t._group) is evaluated on the real ProcessGroup" in finding.message
        assert f"and {group.group_name!r} is compiled into the graph with no guard" in finding.message
        assert finding.fix.startswith("read `t._group.group_name` in the compiled function, where Dynamo guards it")


def scaled_by_size(t):
    return t._data * t._group.size()


def test_a_guarded_member_read_is_info_and_its_fix_runs_as_written():
    """A read in the compiled function, on an input: guarded, one compilation
    per distinct value (info). Its fix reads the value when the graph runs:
    applied, one graph serves both sizes and nothing is reported."""
    from subclasses import GroupTensor, fake_world

    with fake_world(4) as world:
        pair = dist.new_group([0, 1])
        report = cp.explain(scaled_by_size, GroupTensor(torch.ones(2), pair))
        (finding,) = _osc004(report)
        assert (finding.severity, finding.path) == ("info", "t._group.size()")
        assert "while Dynamo traces the compiled function" in finding.message
        assert "a guard protects it (t._group.size() == 2)" in finding.message
        assert "one compilation per distinct value" in finding.message
        namespace = _applied(scaled_by_size, finding.fix, {**globals(), **_fix_code(finding.fix)})
        fixed = namespace["scaled_by_size"]
        torch._dynamo.reset()
        report = cp.explain(fixed, GroupTensor(torch.ones(2), pair))
        assert report.findings == [] and report.errors == []
        report.call(GroupTensor(torch.ones(2), world))
        assert report.recompiles == [] and report.outputs.tolist() == [4.0, 4.0]


def test_a_member_of_an_opaque_made_in_the_graph_is_an_error():
    """``t._mesh["tp"]`` is a DeviceMesh made inside the graph: Dynamo has no
    source to guard its size() by (the library's member fix cannot either)."""
    from subclasses import fake_world
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    with fake_world(4):
        osc.register_opaque(DeviceMesh)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        report = cp.explain(lambda t: t._data * t._mesh["tp"].size(), MeshTensor(torch.ones(2), mesh))
        (finding,) = _osc004(report)
        assert (finding.severity, finding.path) == ("error", "graph 0:DeviceMesh.size()")
        assert '`t._mesh["tp"].size()` is evaluated on the real DeviceMesh' in finding.message
        assert "made inside the graph, so Dynamo has no source to guard it by" in finding.message
        assert 'make t._mesh["tp"] an input' in finding.fix


def test_reads_are_kept_per_compilation():
    """A compilation whose backend does not take its reads leaves them to
    nobody else: the next compilation's backend gets only its own."""
    from subclasses import Gauge, GaugeTensor

    from opaque_subclass.fixes.members import take_member_reads

    torch.compile(lambda t: t._data * t._gauge.factor(), backend="eager")(GaugeTensor(torch.ones(1), Gauge(3)))
    taken = []

    def backend(gm, example_inputs):
        taken.append(take_member_reads())
        return gm.forward

    torch.compile(lambda t: t._data + t._gauge.offset, backend=backend)(GaugeTensor(torch.ones(1), Gauge(3, 4)))
    ((read,),) = taken
    assert (read.member, read.call, read.value, read.path, read.guarded) == ("offset", False, 4, "L['t']._gauge", True)
    assert take_member_reads() == []  # outside a compilation: nothing


def test_the_backend_watches_below_dynamo_only_when_asked():
    """The default backend reports Dynamo's reads (no cost); watch_reads=True
    also finds the read below Dynamo, and "raise" stops on it."""
    from subclasses import GroupScaled, fake_world

    with fake_world(4):
        pair = dist.new_group([0, 1])
        for watch, expected in ((False, []), (True, ["error"])):
            torch._dynamo.reset()
            checks = []
            backend = cp.checking_backend("aot_eager", "record", on_check=checks.append, watch_reads=watch)
            try:
                torch.compile(lambda t: (t * 2)._data, backend=backend)(GroupScaled(torch.ones(2), pair))
            except torch._dynamo.exc.BackendCompilerFailed:
                assert osc.support().mode == "backport"  # torch 2.11 refuses size() on its fake wrapper
            assert [f.severity for c in checks for f in c.findings if f.code == "OSC004"] == expected
        torch._dynamo.reset()
        strict = cp.checking_backend("aot_eager", "raise", watch_reads=True)
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=r"OSC004 \(error\) t._group.size\(\)"):
            torch.compile(lambda t: (t * 2)._data, backend=strict)(GroupScaled(torch.ones(2), pair))


def test_the_watcher_leaves_another_profiler_in_place():
    from compile_passes.reads import ReadWatcher

    def other(frame, event, arg):
        return None

    sys.setprofile(other)
    try:
        with ReadWatcher([("x", MeshTensor(torch.ones(1), Mesh("m")))]) as watcher:
            assert not watcher.watching and sys.getprofile() is other
    finally:
        sys.setprofile(None)
    with ReadWatcher([("x", MeshTensor(torch.ones(1), Mesh("m")))]) as watcher:
        assert watcher.watching
    assert sys.getprofile() is None


# ------------------------------------------------------------------ OSC002


def _graph_holding(obj):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    gm.held = obj
    with gm.graph.inserting_before(next(iter(gm.graph.nodes)).next):
        gm.graph.create_node("get_attr", "held")

    def captured(x):  # a call target closing over the object, as Dynamo's prim_from_local does
        return x if obj is not None else x  # noqa: RUF034 - the target must read obj to close over it

    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        gm.graph.call_function(captured, (out.args[0],))
    gm.recompile()
    return gm


def test_baked_reference_objects_are_found_values_are_not():
    findings = cp.lint_baked(_graph_holding(Mesh("baked")), "g")
    assert [(f.code, f.severity) for f in findings] == [("OSC002", "warning")] * 2
    assert "holds it as an attribute (attribute 'held'): a subclasses.Mesh" in findings[0].message
    assert "calls a function that captured it" in findings[1].message
    assert cp.lint_baked(_graph_holding(Config(3)), "g") == []  # a value opaque is a constant by design
    baked = list(cp.baked_objects(_graph_holding(Config(3))))
    assert [b.how for b in baked] == ["attribute", "closure"] and all(b.reason is None for b in baked)


def scaled_by(mesh):
    """A factory whose function captures the mesh (what OSC002 reports)."""

    @torch._dynamo.allow_in_graph
    def scale(x):
        return x * 2 if mesh is not None else x

    return scale


CAPTURED = Mesh("captured")
scale = scaled_by(CAPTURED)


def doubled_plus_one(x):
    return scale(x) + 1


def test_the_baked_object_fix_runs_as_written():
    """#26 item 5: OSC002 on a function the graph calls that captured a mesh;
    the fix names the function and its call with the captured variable as a
    parameter and an argument. Applied as written (the mesh a global of the
    compiled function), the graph takes the mesh as an input."""
    report = cp.explain(doubled_plus_one, torch.ones(2))
    (finding,) = report.findings
    assert (finding.code, finding.path) == ("OSC002", "graph 0:scale")
    assert _replacements(finding.fix) == [("def scale(x)", "def scale(x, mesh)"), ("scale(x)", "scale(x, mesh)")]
    namespace = _applied(scaled_by, finding.fix, {**globals(), "mesh": CAPTURED})
    namespace["scale"] = namespace["scaled_by"](CAPTURED)
    fixed_step = _applied(doubled_plus_one, finding.fix, namespace)["doubled_plus_one"]
    torch._dynamo.reset()
    fixed = cp.explain(fixed_step, torch.ones(2))
    assert fixed.findings == [] and fixed.errors == []
    assert [i.path for i in fixed.graphs[0].inputs.opaques] == ["mesh"]
    assert fixed.outputs.tolist() == [3.0, 3.0]


# ------------------------------------------------------------------ the backend


def test_backend_by_name_warns():
    x = ShardLike(torch.ones(2), ctx=ShardSpec(ValueMesh(1, "g"), 0))
    with pytest.warns(cp.OpaqueCheckWarning, match=r"OSC001 \(error\) x.<context>.mesh"):
        out = torch.compile(lambda x: x * 2, backend="opaque_check")(x)
    assert torch.equal(out._local, torch.full((2,), 2.0))


def test_backend_raise_log_and_inner():
    x = ShardLike(torch.ones(2), ctx=ShardSpec(ValueMesh(1, "g"), 0))
    with pytest.raises(Exception, match=r"OSC001 \(error\) x.<context>.mesh.*Fix: list it among the attributes"):
        torch.compile(lambda x: x * 2, backend=cp.checking_backend("eager", on_finding="raise"))(x)
    torch._dynamo.reset()
    seen = []

    def inner(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    compiled = []

    def check(c):
        compiled.append(c)

    backend = cp.checking_backend(inner, on_finding="log", on_check=check)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "log" never warns
        out = torch.compile(lambda x: x * 3, backend=backend)(x)
    assert len(seen) == 1 and _codes(compiled[0].findings) == ["OSC001"]
    assert torch.equal(out._local, torch.full((2,), 3.0))
    with pytest.raises(ValueError, match="on_finding='loud'"):
        cp.checking_backend(on_finding="loud")


def test_backend_returns_the_inner_compiled_callable():
    """No run-time cost: the compiled callable is the inner backend's own."""
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    sentinel = object()
    assert cp.checking_backend(lambda g, i: sentinel, "record")(gm, [torch.ones(1)]) is sentinel


def test_backend_logs_through_its_module_logger(caplog):
    x = ShardLike(torch.ones(2), ctx=ShardSpec(ValueMesh(1, "g"), 0))
    with caplog.at_level(logging.INFO, logger="compile_passes.backend"):
        torch.compile(lambda x: x * 2, backend=cp.checking_backend("eager", "log"))(x)
    assert [r.levelname for r in caplog.records if r.name == "compile_passes.backend"] == ["ERROR"]


# ------------------------------------------------------------------ distributed (gloo, world size 1)


@pytest.fixture(scope="module")
def device_mesh():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    with registered_mesh_world_of_one() as mesh:
        yield mesh


def test_dtensor(device_mesh):
    """torch 2.11's DTensor keeps its mesh in the context (DTensorSpec): found.
    Since 2.12 the mesh is a flatten attribute: nothing to report."""
    from torch.distributed.tensor import Shard, distribute_tensor

    x = distribute_tensor(torch.arange(4.0), device_mesh, [Shard(0)])
    report = cp.explain(lambda x: x * 2, x)
    if osc.support().mode == "backport":
        (finding,) = report.findings
        assert finding.code == "OSC001" and finding.path == "x.<context>[0].mesh"
        assert "a DeviceMesh (its == compares the mesh's shape and ranks, not its process groups)" in finding.message
        assert "inside a torch.distributed.tensor._dtensor_spec.DTensorSpec" in finding.message
    else:
        assert report.findings == []
        assert [i.path for i in report.graphs[0].inputs.opaques] == ["x.device_mesh"]


def test_project_sharded_tensor_has_no_finding(device_mesh):
    from opaque_subclass.sharded import ShardedTensor

    w = ShardedTensor.from_full(torch.arange(4.0), device_mesh, 0)
    report = cp.explain(lambda x: x * 2, w)
    assert report.findings == [] and report.errors == []
    assert [i.path for i in report.graphs[0].inputs.opaques] == ["x._mesh"]
