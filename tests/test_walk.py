"""The one walk over a live subclass (opaque_subclass.core.walk): one
``__tensor_flatten__`` call per level per walk, on every route that looks
inside a subclass, and one validation of what it returns."""

from __future__ import annotations

import re

import pytest
import torch
import torch._dynamo
from subclasses import Mesh, MeshTensor, nested

import opaque_subclass as osc
from opaque_subclass.backport.hiding import split_attrs, tensor_leaves
from opaque_subclass.core import checks
from opaque_subclass.core.checks import check_rebuild, validate_input
from opaque_subclass.core.context import MAX_DEPTH, unequal_to_copy, walk_context
from opaque_subclass.core.walk import Attr, Level, read_level, walk


class Counted(MeshTensor):
    """A MeshTensor whose ``__tensor_flatten__`` counts its calls (per class, not per instance)."""

    calls = 0

    def __tensor_flatten__(self):
        type(self).calls += 1
        return super().__tensor_flatten__()


def _nested(levels: int) -> torch.Tensor:
    t: torch.Tensor = torch.ones(3)
    for i in range(levels):
        t = Counted(t, Mesh(f"m{i}"))
    return t


ROUTES = {
    "flatten_subclass": lambda x: osc.flatten_subclass(x),
    "describe_args": lambda x: osc.describe_args([x]),
    "walk": lambda x: list(walk(x)),
    "check_rebuild": lambda x: check_rebuild(x),
    "split_attrs+tensor_leaves": lambda x: (split_attrs(x), tensor_leaves(x)),
    "validate_input": lambda x: validate_input(x, "L['x']"),
}
#: split_attrs reads the top level once more than the walk of tensor_leaves
WALKS = {"split_attrs+tensor_leaves": None}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("levels", [1, 3])
def test_one_flatten_call_per_level_per_walk(route, levels):
    x = _nested(levels)
    Counted.calls = 0
    ROUTES[route](x)
    walks = WALKS.get(route, 1)
    expected = levels + 1 if walks is None else walks * levels
    assert Counted.calls == expected, f"{route}: {Counted.calls} __tensor_flatten__ calls for {levels} levels"


def test_walk_order_and_paths():
    m0, m1 = Mesh("a"), Mesh("b")
    data = torch.ones(2)
    x = Counted(Counted(data, m0), m1)
    got = [(path, type(slot).__name__, getattr(slot, "kind", None)) for path, slot in walk(x, "w")]
    assert got == [
        ("w", "Level", None),
        ("w._data", "Level", None),
        ("w._data._data", "Attr", "tensor"),
        ("w._data._mesh", "Attr", "opaque"),
        ("w._mesh", "Attr", "opaque"),
    ]
    leaves = [slot.value for _, slot in walk(x) if isinstance(slot, Attr)]
    assert leaves[0] is data and leaves[1] is m0 and leaves[2] is m1
    assert leaves == osc.flatten_subclass(x)[0]
    assert list(walk(torch.ones(1))) == []


class Names(torch.Tensor):
    """A subclass whose flatten result is set per instance, to test the validation."""

    @staticmethod
    def __new__(cls, names, ctx=None):
        r = torch.Tensor._make_wrapper_subclass(cls, (2,), dtype=torch.float32)
        r._data, r._mesh, r._names, r._ctx = torch.ones(2), Mesh(), names, ctx
        return r

    def __tensor_flatten__(self):
        names = self._names
        return (names() if callable(names) else names), self._ctx

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, size, stride):
        return cls(list(inner), ctx)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError

    def __repr__(self):
        return "Names()"


@pytest.mark.parametrize(
    ("names", "pattern"),
    [
        (
            None,
            r"Names\.__tensor_flatten__\(\) at 'x' returned attribute names None; the first element must be a list",
        ),
        (
            {"_data", "_mesh"},
            r"returned attribute names as set; they must be a list or tuple.*a set has no order.*Fix: return a list",
        ),
        (
            lambda: (n for n in ["_data", "_mesh"]),
            r"returned attribute names as generator; they must be a list or tuple",
        ),
        (
            ["_data", "_data", "_mesh"],
            r"lists \['_data'\] more than once.*Fix: list each attribute name once, e\.g\. \['_data', '_mesh'\]",
        ),
        (["_data", 3], r"attribute names \['_data', 3\]"),
    ],
    ids=["None", "set", "generator", "duplicate", "non-string"],
)
def test_bad_names_are_refused_with_a_fix(names, pattern):
    x = Names(names)
    with pytest.raises(TypeError, match=pattern):
        read_level(x)
    with pytest.raises(TypeError, match=pattern):
        osc.flatten_subclass(x)


def test_missing_attribute_names_the_path():
    x = Names(["_data", "_nope"])
    with pytest.raises(
        AttributeError, match=r"lists attribute '_nope' \(path 'x\._nope'\) but the tensor has no such attribute"
    ):
        osc.flatten_subclass(x)


def test_level_views():
    m = Mesh()
    level = read_level(Counted(torch.ones(2), m), "p")
    assert isinstance(level, Level) and level.path == "p" and level.names == ("_data", "_mesh")
    assert [a.name for a in level.tensors()] == ["_data"] and level.opaques() == {"_mesh": m}


# ------------------------------------------- where Dynamo meets a subclass input


@pytest.fixture
def checked_paths(monkeypatch):
    """The paths ``validate_input`` walks from Dynamo's ``wrap_tensor`` check
    (``validate_graph_input`` looks it up in its module on every call)."""
    paths: list[str] = []
    original = checks.validate_input

    def recording(t, path, **kwargs):
        paths.append(path)
        return original(t, path, **kwargs)

    monkeypatch.setattr(checks, "validate_input", recording)
    return paths


def test_dynamo_walks_each_input_once_per_graph(checked_paths):
    # Dynamo wraps every inner subclass again as an input of its own
    # (L['t']._data, ...); the outer input's walk checked those levels already.
    torch._dynamo.reset()
    f = torch.compile(lambda t, u: t * 2 + u, backend="aot_eager", fullgraph=True)
    x, y = nested(3), nested(2)
    out = f(x, y)
    assert out._mesh is x._mesh
    assert checked_paths == ["L['t']", "L['u']"]


def test_compiled_calls_run_no_check(checked_paths):
    # the checks run while tracing only: calls that reuse the graph walk nothing
    torch._dynamo.reset()
    f = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
    f(nested(2))
    assert checked_paths == ["L['t']"]
    for _ in range(3):
        x = nested(2)  # new objects, the same structure: the guards pass
        assert f(x)._mesh is x._mesh
    assert checked_paths == ["L['t']"]


def test_dynamo_checks_a_source_again_in_a_new_graph(checked_paths):
    # the record of checked sources is per graph: the same source name in a
    # later compilation names another object, which is walked and refused
    torch._dynamo.reset()
    torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)(nested(2))
    bad = MeshTensor(MeshTensor(torch.ones(2, 3), 7), Mesh("outer"))  # type: ignore[arg-type]  # an int where a mesh belongs
    # the library's TypeError, as raised or inside Dynamo's InternalTorchDynamoError
    with pytest.raises((TypeError, torch._dynamo.exc.InternalTorchDynamoError)) as info:
        torch.compile(lambda t: t * 3, backend="aot_eager", fullgraph=True)(bad)
    assert re.search(r"(?s)MeshTensor.*\"L\['t'\]\._data\._mesh\".*\bint\b.*Fix:", str(info.value)), str(info.value)
    assert checked_paths == ["L['t']", "L['t']"]


# ------------------------------------------------------ the walk over a context


def test_walk_context_paths_cycles_and_depth():

    class Box:
        def __init__(self, inner: object) -> None:
            self.inner = inner

    cyclic: list[object] = [1]
    cyclic.append(cyclic)
    parts = list(walk_context({"spec": Box(cyclic), "n": 3}))
    assert [p.path for p in parts] == [
        "",
        "['spec']",
        "['spec'].inner",
        "['spec'].inner[0]",
        "['spec'].inner[1]",
        "['n']",
    ]
    assert parts[-2].obj is cyclic  # reached twice: yielded, not entered again
    deep: object = "leaf"
    for _ in range(MAX_DEPTH + 3):
        deep = [deep]
    assert max(p.path.count("[") for p in walk_context(deep)) == MAX_DEPTH
    # descend=False keeps the walk out of an object, not from yielding it
    assert [p.path for p in walk_context((Box(1),), descend=lambda o: not isinstance(o, Box))] == ["", "[0]"]


def test_unequal_to_copy_finds_the_innermost_part():

    class Handle:  # compared by identity
        pass

    class Spec:
        def __init__(self, handle: object) -> None:
            self.handle, self.dim = handle, 0

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Spec) and (other.handle, other.dim) == (self.handle, self.dim)

        __hash__ = None  # type: ignore[assignment]

    assert unequal_to_copy((1, "a", torch.float32)) is None
    handle = Handle()
    part = unequal_to_copy((1, {"spec": Spec(handle)}))
    assert part is not None and part.path == "[1]['spec'].handle" and part.obj is handle
    assert isinstance(part.holder, Spec)


def test_compiling_runs_no_unflatten_on_real_tensors():
    """The rebuild check at Dynamo's entry compares the fake instance torch
    builds with the user's ``__tensor_unflatten__`` (on fake inner tensors)
    with the real input: the library calls no ``__tensor_unflatten__`` on real
    tensors that torch would not call (one per level per compilation before)."""
    from torch._subclasses.fake_tensor import is_fake

    calls: list[bool] = []

    class Counting(MeshTensor):
        @classmethod
        def __tensor_unflatten__(cls, inner, ctx, size, stride):
            calls.append(is_fake(inner["_data"]))
            return super().__tensor_unflatten__(inner, ctx, size, stride)

    torch._dynamo.reset()
    x = Counting(torch.ones(3), Mesh())
    out = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(out._data, torch.full((3,), 2.0)) and out._mesh is x._mesh
    # torch's rebuilds while compiling are all on fake tensors; the one real call
    # is the compiled call's output, rebuilt at run time (torch's, as without the library)
    assert calls[-1] is False and all(calls[:-1]) and len(calls) > 1, calls


def test_the_fake_rebuild_check_names_a_wrong_level():
    """``check_fake_rebuild`` raises the rebuild check's error when torch's
    fake instance is not what the real level is (type, inner type or dtype)."""
    from opaque_subclass.core.checks import check_fake_rebuild

    x = nested(2)
    levels = [slot for _, slot in walk(x, "x") if isinstance(slot, Level)]
    check_fake_rebuild(levels, nested(2))  # an equal rebuild passes
    with pytest.raises(TypeError, match=r"MeshTensor.__tensor_unflatten__ \(rebuilding 'x'\) returned torch\.Tensor"):
        check_fake_rebuild(levels, torch.ones(2, 3))
    inner_plain = MeshTensor(torch.ones(2, 3), Mesh("a0"), ctx=("lvl", 1))
    with pytest.raises(TypeError, match=r"rebuilding 'x._data'\) returned torch\.Tensor"):
        check_fake_rebuild(levels, inner_plain)
    doubles = nested(2, data=torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="with dtype torch.float64"):
        check_fake_rebuild(levels, doubles)
