"""One compilation per mesh shape inside a process
(``opaque_subclass.fixes.mesh_guards``).

A program that reads nothing rank-dependent from its ``DeviceMesh`` inputs is
compiled once for every mesh of one shape (pipeline stages, expert groups), and
each call runs on its own mesh's process group; a program that reads a
coordinate is guarded on that value where it reads it; a read below Dynamo (a
subclass's dispatch, DTensor's sharding propagation) keeps torch's guard on
the whole rank map. The same counts on every release, except the read below
Dynamo, which torch 2.11 refuses (its fake mesh answers no member).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch._dynamo.testing
from subclasses import CoordinateShifted, fake_world
from torch.distributed.device_mesh import DeviceMesh

import opaque_subclass
from opaque_subclass.sharded import ShardedTensor, record_collectives
from opaque_subclass.sharded.collectives import define_ops

_MINOR = int(torch.__version__.split(".")[1])

# every list holds rank 0 (the fake world's rank): its coordinate is 0, 1, 0, 1, 0, 1
RANK_LISTS = ([0, 1, 2, 3], [4, 0, 5, 6], [0, 7, 8, 9], [10, 0, 11, 12], [0, 13, 14, 15], [16, 0, 17, 18])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compile_over(
    fn: Callable[[Any], Any], make: Callable[[DeviceMesh], Any], rank_lists: Sequence[Sequence[int]]
) -> tuple[int, list[Any], list[DeviceMesh]]:
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    meshes = [DeviceMesh("cpu", list(ranks)) for ranks in rank_lists]
    outs = [compiled(make(m)) for m in meshes]
    return counter.frame_count, outs, meshes


def test_meshes_of_one_shape_share_one_compilation():
    """Six 4-rank meshes over different ranks: one compilation (torch's guard on
    the rank map compiled six times), each call's all-gather on its own mesh,
    each output on its own mesh."""
    define_ops()
    with fake_world(32):
        with record_collectives() as seen:
            count, outs, meshes = _compile_over(
                lambda x: x.redistribute(None) * 2,
                lambda m: ShardedTensor.from_full(torch.ones(8, 2), m, 0),
                RANK_LISTS,
            )
        assert count == 1
        assert [r.mesh_id for r in seen if r.op == "all_gather"] == [id(m) for m in meshes]
        assert all(out.mesh is m for out, m in zip(outs, meshes, strict=True))


def test_a_mesh_of_another_shape_recompiles():
    define_ops()
    with fake_world(32):
        count, outs, _ = _compile_over(
            lambda x: x.redistribute(None) * 2,
            lambda m: ShardedTensor.from_full(torch.ones(8, 2), m, 0),
            ([0, 1, 2, 3], [0, 5], [4, 0, 5, 6], [0, 9]),
        )
        assert count == 2
        assert [o.local_tensor().shape[0] for o in outs] == [8, 8, 8, 8]


def test_a_coordinate_read_by_the_compiled_function_is_guarded_on_its_value():
    """The coordinate is 0, 1, 0, 1, ...: two compilations, each call adding its own."""
    with fake_world(32):
        count, outs, meshes = _compile_over(
            lambda x: x.local_tensor() + x.mesh.get_coordinate()[0],
            lambda m: ShardedTensor.from_full(torch.zeros(8, 2), m, 0),
            RANK_LISTS,
        )
        assert count == 2
        assert [float(o[0, 0]) for o in outs] == [m.get_coordinate()[0] for m in meshes] == [0, 1, 0, 1, 0, 1]


def test_a_read_below_dynamo_keeps_the_guard_on_the_rank_map():
    """The subclass's dispatch reads the coordinate while AOTAutograd traces:
    nothing but the rank-map guard protects the value compiled in, so each
    rank map compiles anew and every call gets its own coordinate."""
    with fake_world(32):
        make = lambda m: CoordinateShifted(torch.zeros(2), m)  # noqa: E731
        if _MINOR == 11:
            # torch 2.11's fake mesh answers no member while AOTAutograd traces: the read fails
            with pytest.raises(Exception, match="get_coordinate"):
                _compile_over(lambda x: x * 2, make, RANK_LISTS[:2])
            return
        count, outs, _ = _compile_over(lambda x: x * 2, make, RANK_LISTS[:4])
        assert count == 4
        assert [float(o._data[0]) for o in outs] == [0, 1, 0, 1]


def test_dtensor_keeps_one_compilation_per_mesh():
    """DTensor's dispatch reads its mesh while traced: torch's guard stays."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    with fake_world(32):
        count, outs, _ = _compile_over(
            lambda x: (x * 2).redistribute(x.device_mesh, [Replicate()]).to_local(),
            lambda m: DTensor.from_local(torch.ones(2, 2), m, [Shard(0)]),
            RANK_LISTS[:3],
        )
        assert count == 3
        assert [tuple(o.shape) for o in outs] == [(8, 2)] * 3


def test_the_guard_is_torchs_when_the_compilation_cannot_be_told():
    from opaque_subclass.fixes.mesh_guards import make_opaque_guard

    calls = []

    def torchs(builder: object, guard: object) -> None:
        calls.append((builder, guard))

    class Builder:  # no check_fn_manager: the compilation is unknown
        def get(self, guard: object) -> object:
            return mesh

    with fake_world(4):
        mesh = DeviceMesh("cpu", [0, 1])
        builder = Builder()
        make_opaque_guard(torchs)(builder, "guard")
    assert calls == [(builder, "guard")]


def test_the_replacements_are_on():
    on = set(opaque_subclass.support().patched + opaque_subclass.support().fixes)
    assert "torch._dynamo.guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH" in on
    if _MINOR >= 12:  # 2.11's fake mesh answers no member: nothing to record
        assert "torch._library.fake_class_registry.FakeScriptObject.__getattribute__" in on
