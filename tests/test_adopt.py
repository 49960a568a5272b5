"""Adopting a subclass you do not own (#35 item 2): ``opaque_subclass.adopt``.

The subject is ``PhysicsNeMoLikeShardTensor`` (tests/subclasses.py), a
stand-in with the traits of NVIDIA PhysicsNeMo 2.2's ``ShardTensor``: its
``DeviceMesh`` in a spec in the flatten context ``(spec, requires_grad)``, op
outputs and gradients built as the class itself, and a tangent hook that
rebuilds through ``__tensor_unflatten__`` with ``_local_tensor`` alone. The
real class is covered by tests/test_adopt_physicsnemo.py where it is installed.

Each compiled scenario uses 8 meshes of one shape over 8 process groups (fake
process groups, one process): stock, 7 of the 8 outputs (and gradients) carry
the first call's mesh; adopted, none does, with one compilation.
"""

from __future__ import annotations

import concurrent.futures
import copy
import pickle
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._dynamo.testing
from scenarios import fresh_inductor_cache
from subclasses import Mesh, PhysicsNeMoLikeShardTensor, ShardTensorSpec, fake_world

import opaque_subclass as osc
from opaque_subclass import ContextOpaque

ST = PhysicsNeMoLikeShardTensor
SHAPES = ((4,), (4,))


def _declaration() -> dict[str, ContextOpaque]:
    from torch.distributed.device_mesh import DeviceMesh

    return {"_mesh": ContextOpaque("[0].mesh", DeviceMesh)}


@pytest.fixture
def meshes() -> Iterator[list[Any]]:
    """8 ``DeviceMesh``es of one shape (equal), each over a process group of its own."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    torch._dynamo.reset()
    with fake_world(2):
        yield [DeviceMesh.from_group(dist.new_group([0, 1]), "cpu") for _ in range(8)]
    torch._dynamo.reset()


@pytest.fixture
def adopted() -> Iterator[osc.Adoption]:
    adoption = osc.adopt(ST, _declaration())
    try:
        yield adoption
    finally:
        adoption.undo()


def _shard(mesh: Any, placements: tuple[int, ...] = (0,), requires_grad: bool = False) -> Any:
    return ST(torch.arange(4.0), ShardTensorSpec(mesh, placements, SHAPES), requires_grad=requires_grad)


def _ones(mesh: Any, placements: tuple[int, ...] = (0,)) -> Any:
    """A gradient for an output on ``mesh``."""
    return ST(torch.ones(4), ShardTensorSpec(mesh, placements, SHAPES))


def _run(meshes: list[Any], backend: str = "aot_eager") -> dict[str, int]:
    """Compile ``t * 2 + 1`` once, call it with a shard on each mesh, backward
    with a gradient on the same mesh; count outputs and gradients whose mesh is
    not the call's."""
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    f = torch.compile(lambda t: t * 2 + 1, backend=counter)
    stale_outputs = stale_grads = 0
    for mesh in meshes:
        x = _shard(mesh, requires_grad=True)
        out = f(x)
        assert torch.equal(out._local_tensor, torch.arange(4.0) * 2 + 1)
        stale_outputs += out.spec.mesh is not mesh
        out.backward(_ones(mesh))
        assert type(x.grad) is ST and torch.equal(x.grad._local_tensor, torch.full((4,), 2.0))
        stale_grads += x.grad.spec.mesh is not mesh
    return {"stale outputs": stale_outputs, "stale gradients": stale_grads, "compilations": counter.frame_count}


# ------------------------------------------------------------------ what the adoption fixes


def test_the_stock_stand_in_is_stale(meshes):
    assert all(m == meshes[0] for m in meshes) and len({id(m.get_group()) for m in meshes}) == 8
    assert _run(meshes) == {"stale outputs": 7, "stale gradients": 7, "compilations": 1}


def test_adopted_every_output_and_gradient_carries_the_calls_mesh(meshes, adopted):
    assert _run(meshes) == {"stale outputs": 0, "stale gradients": 0, "compilations": 1}


def test_adopted_with_inductor(meshes, adopted):
    with fresh_inductor_cache():
        assert _run(meshes, "inductor") == {"stale outputs": 0, "stale gradients": 0, "compilations": 1}


def test_adopted_program_loaded_from_the_compile_cache_runs_with_the_new_mesh(meshes, adopted):
    from torch._dynamo.utils import counters

    with fresh_inductor_cache():
        for run, mesh in enumerate(meshes[:2]):
            torch._dynamo.reset()  # the next call looks the program up again, as a new process would
            hits = counters["aot_autograd"]["autograd_cache_hit"]
            out = torch.compile(lambda t: t * 2 + 1, backend="inductor")(_shard(mesh))
            assert out.spec.mesh is mesh
            assert (counters["aot_autograd"]["autograd_cache_hit"] > hits) == (run == 1), run


def test_a_tangent_of_other_placements_is_rebuilt_on_its_own_mesh(meshes, adopted):
    # The gradient arrives with other placements than the output: torch calls the class's
    # tangent hook with the context recorded while tracing (the placeholder where the mesh
    # was); the hook rebuilds through __tensor_unflatten__ with _local_tensor alone.
    f = torch.compile(lambda t: t * 3, backend="aot_eager")
    for mesh in meshes[:2]:
        x = _shard(mesh, requires_grad=True)
        f(x).backward(_ones(mesh, placements=(-1,)))
        assert x.grad.spec.mesh is mesh and torch.equal(x.grad._local_tensor, torch.full((4,), 3.0))


def test_compile_passes_report_no_stale_mesh_once_adopted(meshes):
    import compile_passes

    x = _shard(meshes[0])
    assert [f.code for f in compile_passes.explain(lambda t: t * 2, x).findings] == ["OSC001"]
    torch._dynamo.reset()
    with osc.adopt(ST, _declaration()):
        assert compile_passes.explain(lambda t: t * 2, x).findings == []


def test_the_osc001_fix_adopts_the_class_and_runs_as_written(meshes):
    """OSC001's fix names adopt for a class of another package, with the class,
    the attribute, the path and the mesh's class; run as written, it adopts the
    class and the finding is gone."""
    import compile_passes

    (finding,) = compile_passes.lint_contexts(_shard(meshes[0]), "x")
    snippet = re.search(r"adopt it: `([^`]*)`", finding.fix)
    assert snippet is not None, finding.fix
    assert snippet.group(1) == (
        "import opaque_subclass; from subclasses import PhysicsNeMoLikeShardTensor; "
        "from torch.distributed.device_mesh import DeviceMesh; opaque_subclass.adopt(PhysicsNeMoLikeShardTensor, "
        "{'_mesh': opaque_subclass.ContextOpaque('[0].mesh', DeviceMesh)})"
    )
    exec(snippet.group(1), {})
    try:
        assert [a.cls for a in osc.adoptions()] == [ST]
        assert compile_passes.lint_contexts(_shard(meshes[1]), "x") == []
    finally:
        osc.unadopt(ST)


# ------------------------------------------------------------------ the flatten protocol, adopted


def test_flatten_lists_the_mesh_and_leaves_a_placeholder(meshes, adopted):
    a, b = _shard(meshes[0]), _shard(meshes[1])
    names, ctx = a.__tensor_flatten__()
    assert names == ["_local_tensor", "_mesh"] and a._mesh is meshes[0]
    assert ctx == b.__tensor_flatten__()[1] and ctx[0].mesh is not meshes[0]
    assert repr(ctx[0].mesh) == "<adopted opaque '_mesh'>"
    # the guard's deep copy and a pickled cache entry compare equal; the class's guard passes
    assert copy.deepcopy(ctx) == ctx and pickle.loads(pickle.dumps(ctx)) == ctx
    assert ST.__metadata_guard__(copy.deepcopy(ctx), b.__tensor_flatten__()[1])
    assert pickle.dumps(ctx) == pickle.dumps(b.__tensor_flatten__()[1])
    # the instance and its spec are untouched
    assert a.spec.mesh is meshes[0] and a._spec is a.spec and "_mesh" not in vars(a)


def test_unflatten_puts_the_object_back(meshes, adopted):
    a = _shard(meshes[0])
    ctx = a.__tensor_flatten__()[1]
    rebuilt = ST.__tensor_unflatten__({"_local_tensor": a._local_tensor, "_mesh": meshes[3]}, ctx, a.shape, a.stride())
    assert type(rebuilt) is ST and rebuilt.spec.mesh is meshes[3] and rebuilt.spec.placements == (0,)
    leaves, spec = osc.flatten_subclass(a)
    assert leaves[1] is meshes[0] and osc.unflatten_subclass(leaves, spec).spec.mesh is meshes[0]


def test_unflatten_without_the_object_fills_it_from_the_context_or_names_the_problem(meshes, adopted):
    a = _shard(meshes[0])
    # the class's own code, written for its own flatten: the context still holds the mesh
    own = ST.__tensor_unflatten__({"_local_tensor": a._local_tensor}, (a.spec, False), a.shape, a.stride())
    assert own.spec.mesh is meshes[0]
    # the placeholder context and no mesh: nothing to rebuild with
    with pytest.raises(osc.OpaqueSubclassError) as info:
        ST.__tensor_unflatten__({"_local_tensor": a._local_tensor}, a.__tensor_flatten__()[1], a.shape, a.stride())
    message = str(info.value)
    assert message.startswith(
        "subclasses.PhysicsNeMoLikeShardTensor.__tensor_unflatten__ was called without the adopted opaque "
        "'_mesh', and the context's '[0].mesh' is the placeholder"
    ), message
    with pytest.raises(osc.OpaqueTypeError, match=r"got torch\.Tensor for the adopted opaque '_mesh'"):
        ST.__tensor_unflatten__(
            {"_local_tensor": a._local_tensor, "_mesh": torch.zeros(0)}, a.__tensor_flatten__()[1], a.shape, a.stride()
        )


# ------------------------------------------------------------------ declaring: checked, named errors


def _fix(message: str) -> str:
    """The first backticked snippet after ``Fix:``."""
    match = re.search(r"Fix:.*?`([^`]+)`", message, re.S)
    assert match, message
    return match.group(1)


def _run_fix(message: str) -> None:
    """Run the message's fix as written, then undo the adoption it made."""
    try:
        exec(_fix(message), {})
    finally:
        osc.unadopt(ST)


def test_an_unknown_path_names_the_class_the_path_the_type_found_and_a_fix(meshes):
    from torch.distributed.device_mesh import DeviceMesh

    with pytest.raises(osc.OpaqueAttributeError) as info:
        osc.adopt(ST, {"_mesh": ContextOpaque("[0].meshes", DeviceMesh)}, example=_shard(meshes[0]))
    message = str(info.value)
    assert message.startswith(
        "subclasses.PhysicsNeMoLikeShardTensor: adopt's opaques['_mesh'] has path '[0].meshes', but the flatten "
        "context holds a subclasses.ShardTensorSpec at '[0]', which has no '.meshes'; a DeviceMesh sits at '[0].mesh'. "
        "Fix: "
    ), message
    assert _fix(message) == (
        "import opaque_subclass; from subclasses import PhysicsNeMoLikeShardTensor; from "
        "torch.distributed.device_mesh import DeviceMesh; opaque_subclass.adopt(PhysicsNeMoLikeShardTensor, "
        "{'_mesh': opaque_subclass.ContextOpaque('[0].mesh', DeviceMesh)})"
    )
    assert not osc.adoptions()  # nothing was adopted
    _run_fix(message)


def test_a_non_opaque_type_is_refused_with_a_fix_that_runs(meshes):
    class Handle:  # registered by nobody
        pass

    with pytest.raises(osc.OpaqueTypeError) as info:
        osc.adopt(ST, {"_handle": ContextOpaque("[0].mesh", Handle)})
    message = str(info.value)
    assert message.startswith(
        "subclasses.PhysicsNeMoLikeShardTensor: adopt's opaques['_handle'] (at '[0].mesh') names "
        "test_adopt.test_a_non_opaque_type_is_refused_with_a_fix_that_runs.<locals>.Handle, which is not a "
        "registered reference opaque"
    ), message
    assert _fix(message) == "import opaque_subclass; opaque_subclass.register_opaque(Handle)"
    exec(_fix(message), {"Handle": Handle})  # as written, with Handle in scope (the message says so)
    assert osc.opaque_kind(Handle) == "reference"
    with pytest.raises(
        osc.OpaqueTypeError,
        match=r"adopt's opaques\['_spec'\] \(at '\[0\].placements'\) names tuple, a value that torch.compile",
    ):
        osc.adopt(ST, {"_spec": ContextOpaque("[0].placements", tuple)})
    # the object at the path is of another type: found and expected named, the mesh's path suggested
    with pytest.raises(osc.OpaqueTypeError) as info:
        osc.adopt(ST, {"_mesh": ContextOpaque("[0].sharding_shapes", Mesh)}, example=_shard(meshes[0]))
    message = str(info.value)
    assert message.startswith(
        "subclasses.PhysicsNeMoLikeShardTensor: adopt's opaques['_mesh'] expects a subclasses.Mesh at "
        "'[0].sharding_shapes' of the flatten context, found tuple. Fix: declare the path of a Mesh in the context"
    ), message
    assert not osc.adoptions()


def test_a_wrong_type_at_the_path_suggests_where_the_declared_class_sits(meshes):
    from torch.distributed.device_mesh import DeviceMesh

    with pytest.raises(osc.OpaqueTypeError) as info:
        osc.adopt(ST, {"_mesh": ContextOpaque("[0].placements", DeviceMesh)}, example=_shard(meshes[0]))
    message = str(info.value)
    assert "found tuple; a DeviceMesh sits at '[0].mesh'. Fix: `import opaque_subclass;" in message
    _run_fix(message)


@pytest.mark.parametrize(
    ("name", "decl", "error", "text"),
    [
        ("_mesh", "[0].mesh", osc.OpaqueTypeError, "must be an opaque_subclass.ContextOpaque(path, cls)"),
        ("data", None, osc.OpaqueValueError, "would shadow torch.Tensor.data"),
        ("spec", None, osc.OpaqueValueError, "is an attribute of PhysicsNeMoLikeShardTensor already"),
        ("_mesh", ContextOpaque("[0]..mesh", Mesh), osc.OpaqueValueError, "which is not a path into a flatten context"),
    ],
)
def test_bad_declarations(name, decl, error, text):
    with pytest.raises(error) as info:
        osc.adopt(ST, {name: decl if decl is not None else ContextOpaque("[0].mesh", Mesh)})
    assert text in str(info.value)
    assert "Fix:" in str(info.value) and not osc.adoptions()


def test_not_a_subclass():
    with pytest.raises(osc.OpaqueTypeError, match="adopt takes a tensor subclass"):
        osc.adopt(int, {"_mesh": ContextOpaque(".mesh", Mesh)})


def test_an_unknown_path_without_an_example_is_found_on_the_first_flatten(meshes):
    from torch.distributed.device_mesh import DeviceMesh

    with osc.adopt(ST, {"_mesh": ContextOpaque("[1].mesh", DeviceMesh)}):
        with pytest.raises(osc.OpaqueAttributeError, match=r"holds a bool at '\[1\]', which has no '\.mesh'"):
            _shard(meshes[0]).__tensor_flatten__()


# ------------------------------------------------------------------ reversible


def _own_dict() -> dict[str, Any]:
    return dict(vars(ST))


def test_undo_restores_the_class_exactly(meshes):
    before = _own_dict()
    with osc.adopt(ST, _declaration()) as adoption:
        assert adoption.active and osc.adoptions() == (adoption,)
        assert osc.support().adopted == (
            "subclasses.PhysicsNeMoLikeShardTensor: __coerce_same_metadata_as_tangent__, __tensor_flatten__, "
            "__tensor_unflatten__ replaced; _mesh <- <context>[0].mesh",
        )
        assert set(_own_dict()) - set(before) == {"_mesh"}
        assert all(vars(ST)[n] is not before[n] for n in ("__tensor_flatten__", "__tensor_unflatten__"))
        assert osc.adopt(ST, _declaration()) is adoption  # the same declaration again: the same adoption
        with pytest.raises(osc.OpaqueValueError) as info:
            osc.adopt(ST, {"_other": ContextOpaque("[0].mesh", Mesh)})
        assert "is adopted already, with opaques {'_mesh': ContextOpaque('[0].mesh', DeviceMesh)}" in str(info.value)
        assert _fix(str(info.value)) == (
            "import opaque_subclass; from subclasses import PhysicsNeMoLikeShardTensor; "
            "opaque_subclass.unadopt(PhysicsNeMoLikeShardTensor)"
        )
    after = _own_dict()
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert not adoption.active and osc.adoptions() == () and not osc.unadopt(ST) and osc.support().adopted == ()
    x = _shard(meshes[0])
    assert x.__tensor_flatten__() == (["_local_tensor"], (x.spec, False)) and not hasattr(x, "_mesh")


def test_unadopt(meshes):
    osc.adopt(ST, _declaration())
    assert osc.unadopt(ST) and not osc.unadopt(ST)
    assert _run(meshes)["stale outputs"] == 7  # stale again: the class is its own


# ------------------------------------------------------------------ threads

# Threads that stay alive for the session: stock torch 2.11 can crash when a thread
# compiles after another compiling thread has exited (docs/compatibility.md).
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="adopt")


def test_two_threads_adopt_and_compile(meshes):
    barrier = threading.Barrier(2)

    def work(part: list[Any]) -> tuple[osc.Adoption, dict[str, int]]:
        barrier.wait()
        adoption = osc.adopt(ST, _declaration())
        return adoption, _run(part)

    try:
        results = list(_POOL.map(work, [meshes[:4], meshes[4:]]))
    finally:
        osc.unadopt(ST)
    (first, a), (second, b) = results
    assert first is second  # one adoption: the second call found the first in force
    assert a["stale outputs"] == b["stale outputs"] == a["stale gradients"] == b["stale gradients"] == 0


def test_flatten_is_all_or_nothing_and_the_stock_form_always_rebuilds_while_another_thread_adopts(meshes):
    # What a reader sees while another thread adopts and undoes: every flatten is the
    # class's own or the adopted one, never a mix, and the unflatten of every moment
    # reads the class's own form (the adopted unflatten is installed before the adopted
    # flatten, and removed after it).
    x = _shard(meshes[0])
    stock = (["_local_tensor"], (x.spec, False))
    stop, wrong, errors = threading.Event(), [], []

    def toggle() -> int:
        n = 0
        try:
            while not stop.is_set():
                adoption = osc.adopt(ST, _declaration())
                time.sleep(0.0002)  # let the reader run while adopted, then while not
                adoption.undo()
                time.sleep(0.0002)
                n += 1
        except BaseException as e:  # kept for the assertion below
            errors.append(e)
        return n

    toggler = _POOL.submit(toggle)
    seen: dict[str, int] = {"stock": 0, "adopted": 0}
    deadline = time.monotonic() + 20
    try:
        while min(seen.values()) < 200 and time.monotonic() < deadline:
            names, ctx = x.__tensor_flatten__()
            form = "stock" if (names, ctx) == stock else "adopted"
            if form == "adopted" and (names != ["_local_tensor", "_mesh"] or ctx[0].mesh == meshes[0]):
                wrong.append((names, ctx))
            seen[form] += 1
            out = ST.__tensor_unflatten__({"_local_tensor": x._local_tensor}, stock[1], x.shape, x.stride())
            if out.spec.mesh is not meshes[0]:
                wrong.append(out.spec)
    finally:
        stop.set()
    assert toggler.result() > 0 and not errors
    assert not wrong and min(seen.values()) >= 200, seen
