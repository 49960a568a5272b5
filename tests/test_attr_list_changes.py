"""A subclass whose ``__tensor_flatten__`` lists different attributes from one
call to the next: the compiled function must follow eager (torch guards the
attribute list of every subclass input, ``x.__tensor_flatten__()[0] == [...]``;
with opaques in the list the guard must keep holding on every leg, backport
included), never serve the graph compiled for the old list.

Cases: a new list object, the same list object changed in place (a guard that
kept a reference instead of a copy would pass), a module parameter whose list
changes while the module's parameter dict does not (Dynamo skips some guards of
parameters whose dict is unchanged), and a parameter replaced by one with a
different list.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from subclasses import Mesh
from torch.utils._pytree import tree_map_only


class Pick(torch.Tensor):
    """``_data`` plus whichever meshes ``names`` lists; every mesh it was given
    is kept, listed or not, so a change of ``names`` changes what flattens."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, meshes: dict[str, Any], names: list[str]) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data: torch.Tensor, meshes: dict[str, Any], names: list[str]) -> None:
        self._data = data
        self._meshes = dict(meshes)
        self._names = names
        for k, v in meshes.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"Pick({self._names})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return self._names, None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return Pick(inner["_data"], {k: v for k, v in inner.items() if k != "_data"}, list(inner))

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        ref = next(a for a in args if isinstance(a, Pick))
        out = func(
            *tree_map_only(Pick, lambda t: t._data, args), **tree_map_only(Pick, lambda t: t._data, kwargs or {})
        )
        listed = {k: getattr(ref, k) for k in ref._names if k != "_data"}
        return tree_map_only(torch.Tensor, lambda t: Pick(t, {**ref._meshes, **listed}, list(ref._names)), out)


def _listed(t: Pick) -> list[tuple[str, Any]]:
    return [(n, getattr(t, n)) for n in t._names if n != "_data"]


def _same(compiled: Pick, eager: Pick) -> None:
    assert type(compiled) is Pick
    assert compiled._names == eager._names
    got, want = _listed(compiled), _listed(eager)
    assert [n for n, _ in got] == [n for n, _ in want]
    assert all(a is b for (_, a), (_, b) in zip(got, want, strict=True)), (got, want)
    assert torch.equal(compiled._data, eager._data)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_new_list_between_calls(backend):
    a, b = Mesh("a"), Mesh("b")

    def f(x):
        return x * 2

    cf = torch.compile(f, backend=backend, fullgraph=True)
    for names in (["_data", "_a"], ["_data", "_b"], ["_data", "_a", "_b"], ["_data"]):
        x = Pick(torch.ones(2), {"_a": a, "_b": b}, names)
        _same(cf(x), f(x))


def test_list_changed_in_place_between_calls():
    a, b = Mesh("a"), Mesh("b")
    names = ["_data", "_a"]
    x = Pick(torch.ones(2), {"_a": a, "_b": b}, names)
    cf = torch.compile(lambda t: t + 1, backend="aot_eager", fullgraph=True)
    _same(cf(x), x + 1)
    names[1] = "_b"  # the very list object the first call flattened
    _same(cf(x), x + 1)
    names.append("_a")
    _same(cf(x), x + 1)


def test_parameter_list_changes_with_module_dict_unchanged():
    a, b = Mesh("a"), Mesh("b")
    mod = torch.nn.Module()
    mod.w = torch.nn.Parameter(Pick(torch.ones(2), {"_a": a, "_b": b}, ["_data", "_a"]), requires_grad=False)

    def g(t):
        return mod.w * t

    cg = torch.compile(g, backend="aot_eager", fullgraph=True)
    _same(cg(torch.ones(2)), g(torch.ones(2)))
    mod.w._names[1] = "_b"
    _same(cg(torch.ones(2)), g(torch.ones(2)))
    mod.w = torch.nn.Parameter(Pick(torch.ones(2), {"_a": a, "_b": b}, ["_data", "_a", "_b"]), requires_grad=False)
    _same(cg(torch.ones(2)), g(torch.ones(2)))


def test_gradients_follow_the_new_list():
    a, b = Mesh("a"), Mesh("b")

    cf = torch.compile(lambda x: x * 3, backend="aot_eager", fullgraph=True)
    for names in (["_data", "_a"], ["_data", "_b"]):
        x = Pick(torch.ones(2), {"_a": a, "_b": b}, names).requires_grad_()
        out = cf(x)
        _same(out, x.detach() * 3)
        out.sum().backward()
        assert torch.equal(x.grad._data if isinstance(x.grad, Pick) else x.grad, torch.full((2,), 3.0))


class Computed(torch.Tensor):
    """The attribute list computed when ``__tensor_flatten__`` runs, by one of four
    means (``HOW``): a class attribute, a list shared between instances, a method
    of the instance's state, a property reading the instance's ``__dict__``. Every
    mesh given is kept, listed or not."""

    HOW = "class"
    NAMES = ["_data", "_a"]
    SHARED = ["_data", "_a"]

    @staticmethod
    def __new__(cls, data: torch.Tensor, meshes: dict[str, Any], which: str = "_a") -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data: torch.Tensor, meshes: dict[str, Any], which: str = "_a") -> None:
        self._data = data
        self._meshes = dict(meshes)
        for k, v in meshes.items():
            setattr(self, k, v)
        self._which = which
        self.__dict__["_source"] = ["_data", which]

    def __repr__(self) -> str:
        return f"Computed({self.names})"

    def _from_state(self) -> list[str]:
        return ["_data", self._which]

    @property
    def names(self) -> list[str]:
        how = type(self).HOW
        if how == "class":
            return type(self).NAMES
        if how == "shared":
            return Computed.SHARED
        if how == "method":
            return self._from_state()
        return list(self.__dict__["_source"])

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return self.names, None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        listed = [k for k in inner if k != "_data"]
        return Computed(inner["_data"], {k: inner[k] for k in listed}, listed[0])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        ref = next(a for a in args if isinstance(a, Computed))
        out = func(
            *tree_map_only(Computed, lambda t: t._data, args),
            **tree_map_only(Computed, lambda t: t._data, kwargs or {}),
        )
        listed = [k for k in ref.names if k != "_data"]
        meshes = {**ref._meshes, **{k: getattr(ref, k) for k in listed}}
        return tree_map_only(torch.Tensor, lambda t: Computed(t, meshes, listed[0]), out)


@pytest.mark.parametrize("how", ["class", "shared", "method", "dict-property"])
def test_a_computed_list_that_changes_between_calls(how, monkeypatch):
    """However the list is produced, the compiled function follows eager when it
    changes while the flatten context stays equal (an input and a parameter)."""
    monkeypatch.setattr(Computed, "HOW", how)
    monkeypatch.setattr(Computed, "NAMES", ["_data", "_a"])
    monkeypatch.setattr(Computed, "SHARED", ["_data", "_a"])
    a, b = Mesh("a"), Mesh("b")
    x = Computed(torch.ones(2), {"_a": a, "_b": b})
    mod = torch.nn.Module()
    mod.w = torch.nn.Parameter(Computed(torch.ones(2), {"_a": a, "_b": b}), requires_grad=False)

    def f(t: Computed) -> Any:
        return t * 2, mod.w * 3

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)

    def check() -> None:
        for compiled, eager in zip(cf(x), f(x), strict=True):
            assert compiled.names == eager.names
            assert all(getattr(compiled, n) is getattr(eager, n) for n in eager.names if n != "_data")

    check()
    assert not _attr_list_failures()
    for t in (x, mod.w):  # the list changes, by the subclass's own means
        if how == "method":
            t._which = "_b"
        elif how == "dict-property":
            t.__dict__["_source"] = ["_data", "_b"]
    if how == "class":
        Computed.NAMES = ["_data", "_b"]
    elif how == "shared":
        Computed.SHARED[1] = "_b"
    assert x.names == mod.w.names == ["_data", "_b"]
    check()
    # Compiled code follows eager because it compiled again, and it compiled again because
    # the guard on the attribute list failed (not by the chance of another guard): the list
    # is what the compiled code relies on.
    assert any("['_data', '_a']" in r for r in _attr_list_failures()), torch._dynamo.utils.guard_failures
    torch._dynamo.reset()


def _attr_list_failures() -> list[str]:
    """The failed guards that compared a subclass's attribute list (on every release torch
    guards ``x.__tensor_flatten__()[0] == [...]`` of each subclass input)."""
    failures = torch._dynamo.utils.guard_failures
    return [r for reasons in failures.values() for r in reasons if "__tensor_flatten__()[0]" in r]
