"""Property tests over random nesting and opaque placement."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from subclasses import Interleaved, Mesh, MeshTensor, MultiOpaque, PlainPair, Stream

import opaque_subclass as osc

MESHES = [Mesh(f"m{i}") for i in range(3)]
STREAMS = [Stream(i) for i in range(2)]


def _leaf(seed: int) -> torch.Tensor:
    return torch.full((2,), float(seed))


def _node(kind: str, children: list, meshes: list, stream: Stream, ctx: int) -> torch.Tensor:
    if kind == "mesh":
        return MeshTensor(children[0], meshes[0], ctx=ctx)
    if kind == "pair":
        return PlainPair(children[0], children[1], ctx=ctx)
    if kind == "multi":
        return MultiOpaque(children[0], children[1], meshes[0], stream, ctx=ctx)
    return Interleaved(children[0], children[1], meshes[1], ctx=ctx)


ARITY = {"mesh": 1, "pair": 2, "multi": 2, "interleaved": 2}


@st.composite
def trees(draw, depth: int = 3):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return _leaf(draw(st.integers(0, 100)))
    kind = draw(st.sampled_from(sorted(ARITY)))
    children = [draw(trees(depth - 1)) for _ in range(ARITY[kind])]
    meshes = [MESHES[draw(st.integers(0, 2))] for _ in range(2)]
    return _node(kind, children, meshes, STREAMS[draw(st.integers(0, 1))], draw(st.integers(0, 5)))


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _expected_leaves(t) -> list:
    if not osc.is_wrapper_subclass(t):
        return [t]
    out = []
    for name in t.__tensor_flatten__()[0]:
        v = getattr(t, name)
        out.extend(_expected_leaves(v) if isinstance(v, torch.Tensor) else [v])
    return out


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trees())
def test_flatten_unflatten_round_trip(t):
    leaves, spec = osc.flatten_subclass(t)
    assert _same(leaves, _expected_leaves(t))
    rebuilt = osc.unflatten_subclass(leaves, spec)
    assert type(rebuilt) is type(t)
    assert _same(osc.flatten_subclass(rebuilt)[0], leaves)
    if isinstance(spec, osc.SubclassLayout):
        assert spec.arg_count == len(leaves) == spec.num_tensors + spec.num_opaques
        slots = list(osc.iter_slots(spec))
        assert [s.unwrapped_idx for _, s in slots] == list(range(len(leaves)))
        for _, s in slots:
            assert isinstance(leaves[s.unwrapped_idx], torch.Tensor) != isinstance(s, osc.OpaqueSlot)


@SETTINGS
@given(st.lists(trees(), min_size=1, max_size=4))
def test_unwrap_wrap_round_trip_over_argument_lists(args):
    metas = osc.describe_args(args)
    generic = osc.unwrap_args(args, is_joint_structure=False)
    by_spec = osc.unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
    assert _same(generic, by_spec)
    assert _same(generic, [leaf for a in args for leaf in _expected_leaves(a)])
    runtime = [m.runtime_safe() if isinstance(m, osc.SubclassLayout) else m for m in metas]
    for metas_used, is_runtime in ((runtime, True), (metas, False)):
        out = osc.wrap_args(generic, subclass_metas=metas_used, is_runtime=is_runtime)
        assert [type(o) for o in out] == [type(a) for a in args]
        assert _same(osc.unwrap_args(list(out), is_joint_structure=False), generic)


@SETTINGS
@given(st.lists(trees(), min_size=1, max_size=4))
def test_alias_pattern_matches_identity(args):
    flat = osc.unwrap_args(args, is_joint_structure=False)
    pattern = osc.opaque_alias_pattern(flat)
    opaque_slots = [i for i, v in enumerate(flat) if not isinstance(v, torch.Tensor)]
    assert list(pattern.slots) == opaque_slots
    for s, owner in zip(pattern.slots, pattern.owners, strict=True):
        assert flat[s] is flat[owner]
        assert all(flat[j] is not flat[s] for j in opaque_slots if j < owner)
