"""torch's own opaque classes, ``ProcessGroup`` and ``DeviceMesh``, behave the
same on every release (issue #23): the members and guard of torch 2.13's
registration (torch 2.11 included), collectives on a group attribute, the
moment of registration for ``OpaqueSubclass`` declarations, and the named
error for a group or mesh left in a flatten context. Fake process groups
(one process, no communication) stand in for a job."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from scenarios import collectives_on_group_attribute
from subclasses import GroupTensor, _Wrapper, fake_world
from torch._dynamo.testing import CompileCounterWithBackend
from torch.distributed.distributed_c10d import ProcessGroup  # the custom op's annotation

import opaque_subclass as osc
from opaque_subclass.releases import current

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this build")


class MeshHolder(_Wrapper):
    """A tensor and its ``DeviceMesh`` as an opaque attribute."""

    INNER = ("_data",)
    OPAQUES = ("_mesh",)


class InContext(_Wrapper):
    """Keeps whatever ``_ctx`` holds in the flatten context (the classic mistake
    for a group or a mesh)."""

    INNER = ("_data",)


# Eight meshes of four ranks, rank 0 in each, the last rank differing.
RANK_LISTS = [[0, 1, 2, last] for last in range(3, 11)]

# program -> (fn, results, compilations). Rank 0's coordinate is 0 in every mesh:
# only get_group (each mesh's own group, whose name Dynamo compiles in and guards)
# tells the meshes apart.
MESH_PROGRAMS = {
    "nothing": (lambda t: t * 2, [2.0] * 8, 1),
    "size": (lambda t: t * t._mesh.size(), [4.0] * 8, 1),
    "get_coordinate": (lambda t: t * (t._mesh.get_coordinate()[0] + 1), [1.0] * 8, 1),
    "get_group": (lambda t: t * t._mesh.get_group().size(), [4.0] * 8, 8),
    "mesh": (lambda t: t * t._mesh.mesh.sum(), [float(sum(r)) for r in RANK_LISTS], 1),
}


@pytest.mark.parametrize("program", sorted(MESH_PROGRAMS))
def test_mesh_members_are_guarded_on_what_the_program_reads(program):
    """The same program over eight meshes of different rank lists: the same
    results and compilations on every release. torch's guard on the mesh's
    whole rank map compiled 8 times for each; the library's mesh guard
    (opaque_subclass.fixes.mesh_guards) compiles once where the program reads
    nothing that differs (the rank tensor ``mesh`` is a graph input), 8 times
    where it compiles in a group (stock 2.11: every member an error, and one
    compilation)."""
    from torch.distributed.device_mesh import DeviceMesh

    fn, expected, compilations = MESH_PROGRAMS[program]
    with fake_world(16):
        osc.register_opaque(DeviceMesh)
        meshes = [DeviceMesh("cpu", torch.tensor(ranks)) for ranks in RANK_LISTS]
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(fn, backend=counter, fullgraph=True)
        outs = [compiled(MeshHolder(torch.ones(1), m)) for m in meshes]
        assert [o._data.item() for o in outs] == expected
        assert all(o._mesh is m for o, m in zip(outs, meshes, strict=True))
        assert counter.frame_count == compilations


def test_mesh_registration_holds_torch_2_13s_members_and_guard():
    from torch.distributed.device_mesh import DeviceMesh

    with fake_world(4):
        osc.register_opaque(DeviceMesh)
        osc.register_opaque(DeviceMesh)  # again: a no-op
        info = current().registry.torch_module()._OPAQUE_TYPES[DeviceMesh]
        assert info.members["get_coordinate"] == osc.Member.USE_REAL
        assert info.members["get_group"] == osc.Member.INLINED
        assert info.guard_fn is not None
        mesh = DeviceMesh("cpu", torch.arange(4))
        assert list(info.guard_fn(mesh))[:4] == [(0, 1, 2, 3), mesh._layout, "cpu", None]


def test_collectives_on_a_group_attribute_compile_once_per_group():
    """``funcol.all_reduce`` / ``all_gather_tensor`` / ``dist.all_reduce`` on a
    subclass's group: eager's results, four compilations for five calls over
    four groups, on every release (stock 2.11: ``Unsupported group type``)."""
    assert collectives_on_group_attribute() == [("all_reduce", 4), ("all_gather_tensor", 4), ("dist.all_reduce", 4)]


def test_custom_op_taking_the_group_compiles_once():
    """A custom op whose schema takes a ``ProcessGroup`` resolves the group when
    it runs: one compilation for every group, each call its group's size."""
    with fake_world(4) as world:

        @torch.library.custom_op("opaque_subclass_tests::scale_by_group_size", mutates_args=())
        def scale_by_group_size(t: torch.Tensor, pg: ProcessGroup) -> torch.Tensor:
            return t * pg.size()

        @scale_by_group_size.register_fake
        def _(t: torch.Tensor, pg: ProcessGroup) -> torch.Tensor:
            return torch.empty_like(t)

        groups = [world, dist.new_group([0, 1]), dist.new_group([0, 1]), world]
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        f = torch.compile(lambda t: scale_by_group_size(t._data, t._group), backend=counter, fullgraph=True)
        assert [f(GroupTensor(torch.ones(1), g)).item() for g in groups] == [4.0, 2.0, 2.0, 4.0]
        assert counter.frame_count == 1


def test_opaque_subclass_naming_torchs_classes_is_accepted_on_every_release():
    """In a fresh process (nothing registered yet): declaring an
    ``OpaqueSubclass`` with a ``ProcessGroup`` and a ``DeviceMesh`` attribute
    registers both as torch registers them (stock: refused on 2.11 - 2.13, and
    for the mesh on 2.14 - 2.15, until ``torch.distributed.tensor`` is imported)."""
    code = textwrap.dedent(
        """
        import opaque_subclass as osc
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.distributed_c10d import ProcessGroup
        from opaque_subclass.releases import current

        class Grouped(osc.OpaqueSubclass):
            tensor_attrs = ("_data",)
            opaque_attrs = {"_g": ProcessGroup, "_m": DeviceMesh}

        table = current().registry.torch_module()._OPAQUE_TYPES
        assert osc.opaque_kind(ProcessGroup) == osc.opaque_kind(DeviceMesh) == "reference"
        assert "size" in table[ProcessGroup].members and table[DeviceMesh].guard_fn is not None
        print("ACCEPTED")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ACCEPTED" in out.stdout, out.stdout + out.stderr[-3000:]


def _group_and_mesh(which: str) -> object:
    if which == "group":
        return dist.new_group([0, 1])
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.arange(4))


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph-breaks"])
@pytest.mark.parametrize(
    ("which", "found", "spelled"),
    [
        (
            "group",
            "torch.distributed.distributed_c10d.ProcessGroup",
            "from torch.distributed.distributed_c10d import ProcessGroup",
        ),
        ("mesh", "torch.distributed.device_mesh.DeviceMesh", "from torch.distributed.device_mesh import DeviceMesh"),
    ],
)
def test_group_or_mesh_in_a_flatten_context_is_named(which, found, spelled, fullgraph):
    """The classic mistake, a real group or mesh kept in the flatten context:
    the library's TypeError names the subclass, the context path, the type and
    a fix, on every release (stock: ``cannot pickle ... ProcessGroup`` and 58
    lines of guard errors for a group; a mesh compiled once and every later
    call run with the first call's mesh)."""
    with fake_world(4):
        held = _group_and_mesh(which)
        x = InContext(torch.ones(2), ctx=("row", {"comm": held}))
        torch._dynamo.reset()
        f = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=fullgraph)
        with pytest.raises(osc.OpaqueTypeError) as info:
            f(x)
        message = str(info.value)
        assert "test_torch_opaques.InContext.__tensor_flatten__() at \"L['t']\"" in message, message
        assert f"<context>[1]['comm'] holds {found}, a communicator of this job" in message, message
        fix = re.search(r"Fix: .*?`([^`]+)`", message).group(1)
        assert fix == f"import opaque_subclass; {spelled}; opaque_subclass.register_opaque({found.rsplit('.', 1)[1]})"
        exec(fix, {})  # runs as written (a no-op where torch registered the class)
        assert osc.opaque_kind(type(held)) == "reference"
