"""Guards on subclass inputs whose class flattens every instance alike
(``opaque_subclass.fixes.subclass_guards``, issue #39).

Such a class (a ``__tensor_flatten__`` built from constants, an
``OpaqueSubclass`` without ``meta_attrs``) is guarded once per class and call
instead of by Dynamo's two Python calls of ``__tensor_flatten__`` per input; what
those calls protected still recompiles: a replaced method, an instance's own
``__tensor_flatten__``, a changed class declaration. Every other class keeps
torch's guards. The same on every release (2.11 through the backport).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo.testing
from scenarios import python_flatten_calls_per_input
from subclasses import ConstantMeshTensor, Mesh, MeshTensor, PlainPair

from opaque_subclass import OpaqueSubclass
from opaque_subclass.fixes.subclass_guards import constant_flatten


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _fn(*xs: Any) -> list[Any]:
    return [x + 1 for x in xs]


def _compiled() -> tuple[Any, Any, torch._dynamo.testing.CompileCounterWithBackend]:
    """A fresh copy of ``_fn`` (its own code object, so its own cache entries), compiled."""
    fn = type(_fn)(_fn.__code__.replace(), _fn.__globals__, "fn")
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    return fn, torch.compile(fn, backend=counter, fullgraph=True), counter


class Declared(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


class DeclaredWithMeta(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_tag",)


class ConstantNoOpaque(PlainPair):
    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["a", "b"], None


def test_which_classes_flatten_every_instance_alike():
    mesh = Mesh("m")
    assert constant_flatten(ConstantMeshTensor(torch.ones(2), mesh)) is not None
    assert constant_flatten(Declared(torch.ones(2), mesh)) is not None
    # a context read from the instance, a declared meta attribute, no opaque: torch's guards
    assert constant_flatten(MeshTensor(torch.ones(2), mesh)) is None
    assert constant_flatten(DeclaredWithMeta(torch.ones(2), mesh, "t")) is None
    assert constant_flatten(ConstantNoOpaque(torch.ones(2), torch.ones(2))) is None


@pytest.mark.parametrize(
    "make, per_input",
    [
        (lambda m: ConstantMeshTensor(torch.ones(2), m), 0),
        (lambda m: Declared(torch.ones(2), m), 0),
        (lambda m: MeshTensor(torch.ones(2), m), 2),
        (lambda m: DeclaredWithMeta(torch.ones(2), m, "t"), 2),
    ],
    ids=["constant", "opaque-subclass", "context-per-instance", "meta-attrs"],
)
def test_python_flatten_calls_per_input(make, per_input):
    """0 for the classes above, torch's 2 for the others; one compilation for
    new instances on new meshes, each output on its own call's mesh."""
    fn, compiled, counter = _compiled()
    for call in range(3):
        meshes = [Mesh(f"{call}-{i}") for i in range(3)]
        outs = compiled(*(make(m) for m in meshes))
        assert all(o._mesh is m for o, m in zip(outs, meshes, strict=True))
        assert all(torch.equal(o._data, torch.full((2,), 2.0)) for o in outs)
    assert counter.frame_count == 1
    assert python_flatten_calls_per_input(fn.__code__) == per_input


def test_a_replaced_flatten_recompiles():
    """The class's ``__tensor_flatten__`` replaced after compiling (a monkeypatch, an
    adoption): the class guard fails and the new method is traced."""

    class Patched(ConstantMeshTensor):
        pass

    _, compiled, counter = _compiled()
    compiled(Patched(torch.ones(2), Mesh("a")))
    reasons: list[str] = []

    def with_a_context(self: Any) -> tuple[list[str], Any]:
        return ["_data", "_mesh"], "v2"  # what torch's context guard would have caught

    Patched.__tensor_flatten__ = with_a_context  # type: ignore[method-assign]
    try:
        with torch._dynamo.config.patch(error_on_recompile=False):
            (out,) = compiled(Patched(torch.ones(2), Mesh("b")))
        from torch._dynamo.utils import guard_failures

        reasons = [r for rs in guard_failures.values() for r in rs]
    finally:
        del Patched.__tensor_flatten__
    assert counter.frame_count == 2
    assert any("___check_constant_flatten_" in r for r in reasons), reasons
    assert torch.equal(out._data, torch.full((2,), 2.0))


def test_an_instance_flatten_of_its_own_recompiles():
    _, compiled, counter = _compiled()
    compiled(ConstantMeshTensor(torch.ones(2), Mesh("a")))
    odd = ConstantMeshTensor(torch.ones(2), Mesh("b"))
    odd.__tensor_flatten__ = lambda: (["_data", "_mesh"], "own")  # type: ignore[method-assign]
    compiled(odd)
    assert counter.frame_count == 2
    # and the plain instance still hits the first compilation
    compiled(ConstantMeshTensor(torch.ones(2), Mesh("c")))
    assert counter.frame_count == 2


def test_a_changed_declaration_recompiles():
    """An ``OpaqueSubclass`` whose declared attributes change after compiling is traced again."""

    class Growing(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}

    _, compiled, counter = _compiled()
    compiled(Growing(torch.ones(2), Mesh("a")))
    calls = []
    original = Growing._opaque_constant_flatten.__func__  # type: ignore[attr-defined]

    def counting(cls: type) -> Any:
        calls.append(cls)
        return original(cls)

    Growing._opaque_constant_flatten = classmethod(counting)  # type: ignore[method-assign, assignment]
    compiled(Growing(torch.ones(2), Mesh("b")))
    assert counter.frame_count == 1 and calls == [Growing], "the class guard reads the declaration per call"
    Growing._opaque_constant_flatten = classmethod(lambda cls: (["_data", "_other"], ()))  # type: ignore[method-assign, assignment]
    with torch._dynamo.config.patch(error_on_recompile=False):
        compiled(Growing(torch.ones(2), Mesh("c")))
    assert counter.frame_count == 2
