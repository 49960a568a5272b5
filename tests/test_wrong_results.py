"""The last wrong results (issue #24, item 4): bad inputs that gave a silent
wrong result, or a crash inside code that is not the user's, on some route.

Five families, each on every route where it applies (``api``: the run-time
helpers and their generated fast path; ``aot_eager``/``inductor``:
``torch.compile``; ``export``: ``torch.export``, strict and non-strict):

(a) an attribute list that changes while the flatten context stays equal: the
    API's unwrap with metadata read the old names (a stale opaque); a tangent
    listing other attributes than its forward output was read at the output's
    names (API and compiled backward: a stale opaque in the gradient, or
    ``AttributeError``/``AssertionError`` inside torch). Compiled forwards are
    guarded on the list by torch itself (tests/test_attr_list_changes.py).
(b) a non-opaque in an opaque slot of the run-time fast path (unwrap and wrap):
    accepted silently.
(c) an opaque attribute deleted between calls (``del x._mesh``): a bare
    ``AttributeError`` from generated code (API), and on every route a message
    without what was found or a fix that runs; an opaque leaf deleted from a
    parametrization (``del module.parametrizations.w.original1``): the
    property ``w`` reported missing.
(d) a non-module where a module is expected: ``AttributeError`` deep inside.
(e) an opaque class whose ``__getattr__`` answers every name: torch took it for
    a TorchScript object (``AssertionError: tracing_mode can be either real or
    fake`` inside torch) under ``torch.compile`` and strict ``torch.export``.

Every error asserted here is the library's: its message names the subclass (or
the function), the path, what was found and a fix, and where the fix is a
statement the test runs it and checks that the call then works.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch._dynamo
from subclasses import Anything, Listing, Mesh, MeshTensor, Stream

import compile_passes
import opaque_subclass as osc
from opaque_subclass.core.errors import OpaqueAttributeError, OpaqueSubclassError, OpaqueTypeError

BACKENDS = ["aot_eager", "inductor"]


# ----------------------------------------------------------------- helpers


def _library_error(error: BaseException) -> BaseException:
    """The library's error behind ``error``: Dynamo may wrap it (``__cause__``,
    or ``__context__`` where Dynamo re-raises ``from None``)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OpaqueSubclassError):
            return seen
        seen = seen.__cause__ or seen.__context__
    raise AssertionError(f"not the library's error: {type(error).__name__}: {error}") from error


def _raises(fn: Any, kind: type[BaseException], *parts: str) -> str:
    """Run ``fn``; the library's error must be a ``kind`` whose message holds
    every one of ``parts`` and a ``Fix:``. Returns the message."""
    with pytest.raises(Exception) as info:
        fn()
    error = _library_error(info.value)
    assert isinstance(error, kind), (type(error), error)
    text = " ".join(str(error).split())
    for part in (*parts, "Fix:"):
        assert part in text, f"{part!r} not in: {text}"
    return text


def _snippets(text: str) -> list[str]:
    """The backticked statements of a message's fix."""
    return re.findall(r"`([^`]+)`", text.split("Fix:", 1)[1])


def _compiled(backend: str, fn: Any) -> Any:
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True)


def _metas(*args: Any) -> list[Any]:
    return osc.describe_args(list(args))


def _unwrap(args: list[Any], metas: list[Any]) -> list[Any]:
    return osc.unwrap_args(args, is_joint_structure=False, subclass_metas=metas)


# ------------------------------------- (a) the attribute list changes, context equal


def test_api_unwrap_refuses_a_changed_attribute_list():
    a, b = Mesh("a"), Mesh("b")
    metas = _metas(Listing(torch.ones(2), ["_data", "_a"], _a=a, _b=b))
    x = Listing(torch.ones(2), ["_data", "_b"], _a=a, _b=b)  # still holds _a: read by name, it is stale
    text = _raises(
        lambda: _unwrap([x], metas),
        OpaqueTypeError,
        "subclasses.Listing",
        "args[0]",
        "['_data', '_b']",
        "'args[0]._a'",
        "subclasses.Mesh",
    )
    (fix,) = _snippets(text)
    scope: dict[str, Any] = {"args": [x]}
    exec(fix, scope)
    flat = _unwrap([x], scope["metas"])
    assert flat[1] is b


def test_api_unwrap_refuses_a_changed_nested_list():
    a, b = Mesh("a"), Mesh("b")
    inner = Listing(torch.ones(2), ["_data", "_a"], _a=a, _b=b)
    x = MeshTensor(inner, Mesh("outer"))
    metas = _metas(x)
    inner._names = ["_data", "_b"]
    _raises(lambda: _unwrap([x], metas), OpaqueTypeError, "Listing", "args[0]._data", "['_data', '_b']")


def test_api_unwrap_still_accepts_names_returned_as_a_tuple_after_a_change_of_list():
    a, b = Mesh("a"), Mesh("b")
    x = Listing(torch.ones(2), ("_data", "_a"), _a=a, _b=b)
    metas = _metas(x)
    assert _unwrap([x], metas)[1] is a
    x._names = ("_data", "_b")
    _raises(lambda: _unwrap([x], metas), OpaqueTypeError, "['_data', '_b']")


def test_api_tangent_listing_other_attributes_is_refused():
    a, b = Mesh("a"), Mesh("b")
    out = Listing(torch.ones(2), ["_data", "_a"], _a=a)
    (meta,) = osc.describe_args([out], with_memory_format=True)
    tangent = Listing(torch.ones(2), ["_data", "_b"], _a=Mesh("stale"), _b=b)
    _raises(
        lambda: osc.unwrap_tangent(tangent, meta),
        OpaqueTypeError,
        "subclasses.Listing",
        "'tangent'",
        "['_data', '_b']",
        "['_data', '_a']",
        "'tangent._b' holding subclasses.Mesh",
        "out.backward(torch.ones_like(out))",
    )


def test_api_tangent_with_an_opaque_in_a_tensor_slot_is_refused():
    out = Listing(torch.ones(2), ["_data", "_aux"], _aux=torch.ones(2))
    (meta,) = osc.describe_args([out], with_memory_format=True)
    tangent = Listing(torch.ones(2), ["_data", "_aux"], _aux=Mesh("m"))
    _raises(lambda: osc.unwrap_tangent(tangent, meta), OpaqueTypeError, "'tangent._aux'", "subclasses.Mesh")


def _backward_with(backend: str, tangent: Listing) -> Listing:
    f = _compiled(backend, lambda t: t * 2)
    x = Listing(torch.ones(2), ["_data", "_a"], _a=Mesh("a")).requires_grad_()
    f(x).backward(tangent)
    return x.grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_backward_refuses_a_tangent_listing_other_attributes(backend):
    b = Mesh("b")
    # eager: the gradient carries the tangent's _b; compiled read the stale _a instead
    tangent = Listing(torch.ones(2), ["_data", "_b"], _a=Mesh("stale"), _b=b)
    _raises(
        lambda: _backward_with(backend, tangent),
        OpaqueTypeError,
        "subclasses.Listing",
        "['_data', '_b']",
        "['_data', '_a']",
        "subclasses.Mesh",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_backward_refuses_a_tangent_without_the_outputs_attribute(backend):
    tangent = Listing(torch.ones(2), ["_data", "_b"], _b=Mesh("b"))  # AttributeError inside torch before
    _raises(lambda: _backward_with(backend, tangent), OpaqueTypeError, "Listing", "['_data', '_b']")


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_backward_refuses_a_tensor_where_the_output_held_an_opaque(backend):
    tangent = Listing(torch.ones(2), ["_data", "_a"], _a=torch.ones(2))
    _raises(lambda: _backward_with(backend, tangent), OpaqueTypeError, "._a", "torch.Tensor", "reference opaque")


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_backward_with_a_matching_tangent_is_unchanged(backend):
    """The fix passes a tangent of the output's structure through: with one
    that lists other names first (refused), the next matching one works."""
    _raises(lambda: _backward_with(backend, Listing(torch.ones(2), ["_data", "_b"], _b=Mesh("b"))), OpaqueTypeError)
    grad = _backward_with(backend, Listing(torch.ones(2), ["_data", "_a"], _a=Mesh("a")))
    assert grad._names == ["_data", "_a"] and torch.equal(grad._data, torch.full((2,), 2.0))


# ------------------------------------------- (b) a non-opaque in an opaque slot


@pytest.mark.parametrize("value", [3, None, torch.ones(2), "mesh"], ids=["int", "None", "tensor", "str"])
def test_api_unwrap_checks_opaque_slots(value):
    x = MeshTensor(torch.ones(2), Mesh())
    metas = _metas(x)
    x._mesh = value
    kind = "torch.Tensor" if isinstance(value, torch.Tensor) else type(value).__name__
    text = _raises(lambda: _unwrap([x], metas), OpaqueTypeError, "subclasses.MeshTensor", "args[0]._mesh", kind)
    (fix, *_) = _snippets(text)
    scope: dict[str, Any] = {"args": [x], "obj": Mesh("back")}
    exec(fix, scope)
    assert _unwrap([x], metas)[1] is scope["obj"]


def test_api_unwrap_of_an_unregistered_object_says_how_to_register_it():
    class Handle:
        pass

    x = MeshTensor(torch.ones(2), Mesh())
    metas = _metas(x)
    x._mesh = Handle()
    text = _raises(lambda: _unwrap([x], metas), OpaqueTypeError, "args[0]._mesh", "Handle")
    assert "opaque_subclass.register_opaque(Handle" in text


def test_api_unwrap_checks_nested_opaque_slots():
    x = MeshTensor(MeshTensor(torch.ones(2), Mesh("i")), Mesh("o"))
    metas = _metas(x)
    x._data._mesh = 7
    _raises(lambda: _unwrap([x], metas), OpaqueTypeError, "args[0]._data._mesh", "int")


def test_api_unwrap_accepts_another_registered_reference_opaque():
    x = MeshTensor(torch.ones(2), Mesh())
    metas = _metas(x)
    x._mesh = Stream(1)  # another registered type: an opaque slot takes any reference opaque
    assert _unwrap([x], metas)[1] is x._mesh
    x._mesh = 1
    with pytest.raises(OpaqueTypeError):
        _unwrap([x], metas)


@pytest.mark.parametrize("value", [3, torch.ones(2)], ids=["int", "tensor"])
def test_api_wrap_checks_opaque_slots(value):
    metas = [m.runtime_safe() for m in _metas(MeshTensor(torch.ones(2), Mesh()))]
    kind = "torch.Tensor" if isinstance(value, torch.Tensor) else "int"
    _raises(
        lambda: osc.wrap_args([torch.ones(2), value], subclass_metas=metas, is_runtime=True),
        OpaqueTypeError,
        "subclasses.MeshTensor",
        "flat slot 1",
        "x._mesh",
        kind,
    )


def test_api_wrap_of_attributes_named_unlike_identifiers_checks_opaque_slots():
    """Names that are not identifiers take the data-driven fallback: checked too."""

    class Odd(MeshTensor):
        def __tensor_flatten__(self) -> tuple[list[str], Any]:
            return ["_data", "the mesh"], None

        @classmethod
        def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
            return cls(inner["_data"], inner["the mesh"])

    x = Odd(torch.ones(2), Mesh())
    setattr(x, "the mesh", Mesh())
    metas = [m.runtime_safe() for m in _metas(x)]
    _raises(
        lambda: osc.wrap_args([torch.ones(2), 5], subclass_metas=metas, is_runtime=True),
        OpaqueTypeError,
        "x.the mesh",
        "int",
    )


# --------------------------------------------- (c) an opaque attribute deleted


def test_api_unwrap_of_a_deleted_opaque_names_it():
    x = MeshTensor(torch.ones(2), Mesh())
    metas = _metas(x)
    del x._mesh
    text = _raises(
        lambda: _unwrap([x], metas),
        OpaqueAttributeError,
        "subclasses.MeshTensor",
        "args[0]._mesh",
        "found: nothing",
        "subclasses.Mesh",
    )
    (fix, *_) = _snippets(text)
    mesh = Mesh("again")
    exec(fix, {"args": [x], "value": mesh})
    assert _unwrap([x], metas)[1] is mesh


def test_api_unwrap_of_a_deleted_nested_opaque_names_it():
    x = MeshTensor(MeshTensor(torch.ones(2), Mesh("i")), Mesh("o"))
    metas = _metas(x)
    del x._data._mesh
    _raises(lambda: _unwrap([x], metas), OpaqueAttributeError, "args[0]._data._mesh", "found: nothing")


def test_api_tangent_of_a_deleted_opaque_names_it():
    (meta,) = osc.describe_args([MeshTensor(torch.ones(2), Mesh())], with_memory_format=True)
    tangent = MeshTensor(torch.ones(2), Mesh())
    del tangent._mesh
    _raises(lambda: osc.unwrap_tangent(tangent, meta), OpaqueAttributeError, "tangent._mesh", "found: nothing")


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_call_after_deleting_the_opaque_names_it(backend):
    f = _compiled(backend, lambda t: t * 2)
    x = MeshTensor(torch.ones(2), Mesh())
    assert f(x)._mesh is x._mesh
    del x._mesh
    text = _raises(
        lambda: f(x), OpaqueAttributeError, "subclasses.MeshTensor", "L['t']._mesh", "found: nothing", "t._mesh = value"
    )
    mesh = Mesh("again")
    exec(_snippets(text)[0], {"t": x, "value": mesh})
    assert f(x)._mesh is mesh


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_call_after_deleting_a_nested_opaque_names_it(backend):
    f = _compiled(backend, lambda t: t + 1)
    x = MeshTensor(MeshTensor(torch.ones(2), Mesh("i")), Mesh("o"))
    f(x)
    del x._data._mesh
    _raises(lambda: f(x), OpaqueAttributeError, "L['t']._data._mesh", "found: nothing")


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_of_a_deleted_opaque_names_it(strict):
    class Double(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t * 2

    x = MeshTensor(torch.ones(2), Mesh())
    del x._mesh
    _raises(
        lambda: torch.export.export(Double(), (x,), strict=strict),
        OpaqueAttributeError,
        "subclasses.MeshTensor",
        "._mesh",
        "found: nothing",
    )


# (c) through nn.utils.parametrize: an opaque leaf deleted from module.parametrizations.w.
# torch's read of the leaf fails inside the property ``w``, where Python reports any
# AttributeError as the property missing, so the library's error is not an AttributeError.


class _Holds(torch.nn.Module):
    def __init__(self, mesh: Mesh) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(MeshTensor(torch.ones(2), mesh), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def _deleted_leaf(module: torch.nn.Module, path: str, where: str, attribute: str, *also: str) -> str:
    """Read ``module``'s parametrized tensor at ``path`` after its opaque leaf
    was deleted: the library's error, not an AttributeError, naming ``where``."""
    text = _raises(
        lambda: module.get_submodule(path.rpartition(".")[0]).w,
        OpaqueSubclassError,
        "subclasses.MeshTensor",
        f"{where}.original1, the opaque the subclass holds at {attribute}",
        "found: nothing",
        *also,
    )
    return text


def test_parametrization_read_of_a_deleted_opaque_leaf_names_it():
    module = osc.unwrap_subclass_parameters(_Holds(Mesh("w")))
    del module.parametrizations.w.original1
    with pytest.raises(OpaqueSubclassError) as info:
        _ = module.w
    assert not isinstance(info.value, AttributeError)  # the property would report 'w' missing
    text = _deleted_leaf(module, "w", "module.parametrizations.w", "w._mesh", "subclasses.Mesh")
    (fix, *_) = _snippets(text)
    mesh = Mesh("again")
    exec(fix, {"module": module, "value": mesh})
    assert module.w._mesh is mesh and module(torch.ones(2))._mesh is mesh


def test_parametrization_deleted_leaf_of_a_submodule_gives_a_fix_that_runs():
    root = torch.nn.Module()
    root.layer = _Holds(Mesh("a"))
    root.blocks = torch.nn.Sequential(_Holds(Mesh("b")))
    osc.unwrap_subclass_parameters(root)
    del root.layer.parametrizations.w.original1
    del root.blocks[0].parametrizations.w.original1
    for path, where in (
        ("layer.w", "module.layer.parametrizations.w"),
        ("blocks.0.w", "module.get_submodule('blocks.0').parametrizations.w"),
    ):
        (fix, *_) = _snippets(_deleted_leaf(root, path, where, "w._mesh"))
        mesh = Mesh(path)
        exec(fix, {"module": root, "value": mesh})
        assert root.get_submodule(path.rpartition(".")[0]).w._mesh is mesh


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_module_after_deleting_an_opaque_leaf_names_it(backend):
    torch._dynamo.reset()
    module = osc.unwrap_subclass_parameters(_Holds(Mesh("w")))
    f = torch.compile(module, backend=backend)
    assert f(torch.ones(2))._mesh is module.w._mesh
    del module.parametrizations.w.original1
    text = _raises(
        lambda: f(torch.ones(2)), OpaqueSubclassError, "module.parametrizations.w.original1", "found: nothing"
    )
    mesh = Mesh("again")
    exec(_snippets(text)[0], {"module": module, "value": mesh})
    assert f(torch.ones(2))._mesh is mesh


def test_fullgraph_compile_after_deleting_an_opaque_leaf_is_a_graph_break_at_the_check():
    """With ``fullgraph=True`` torch reports a graph break where the library's
    check (a function torch.compile must not trace) is called; the same
    program without ``fullgraph`` gives the library's error."""
    torch._dynamo.reset()
    module = osc.unwrap_subclass_parameters(_Holds(Mesh("w")))
    f = torch.compile(module, backend="aot_eager", fullgraph=True)
    f(torch.ones(2))
    del module.parametrizations.w.original1
    with pytest.raises(torch._dynamo.exc.Unsupported):
        f(torch.ones(2))
    torch._dynamo.reset()
    g = torch.compile(module, backend="aot_eager")
    _raises(lambda: g(torch.ones(2)), OpaqueSubclassError, "module.parametrizations.w.original1")


def test_non_strict_export_after_deleting_an_opaque_leaf_names_it():
    module = osc.unwrap_subclass_parameters(_Holds(Mesh("w")))
    del module.parametrizations.w.original1
    _raises(
        lambda: torch.export.export(module, (torch.ones(2),), strict=False),
        OpaqueSubclassError,
        "module.parametrizations.w.original1",
        "found: nothing",
    )


def test_torchs_own_unwrap_after_deleting_an_opaque_leaf_names_it():
    from torch._functorch._aot_autograd.subclass_parametrization import unwrap_tensor_subclass_parameters

    module = unwrap_tensor_subclass_parameters(_Holds(Mesh("w")))
    del module.parametrizations.w.original1
    text = _deleted_leaf(module, "w", "module.parametrizations.w", "w._mesh")
    mesh = Mesh("again")
    exec(_snippets(text)[0], {"module": module, "value": mesh})
    assert module.w._mesh is mesh


class _TwoTensors(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    def right_inverse(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x / 2, x / 2]


def test_a_deleted_leaf_of_a_list_without_opaques_keeps_torchs_error():
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(torch.ones(2))
    torch.nn.utils.parametrize.register_parametrization(module, "w", _TwoTensors())
    del module.parametrizations.w.original1
    with pytest.raises(AttributeError, match="has no attribute 'w'") as info:
        _ = module.w
    assert not isinstance(info.value, OpaqueSubclassError)


# ------------------------------------------------ (d) a non-module for a module


NOT_MODULES = {
    "None": None,
    "int": 3,
    "tensor": MeshTensor(torch.ones(2), Mesh()),
    "class": torch.nn.Linear,
    "list": [torch.nn.Linear(1, 1)],
}


@pytest.mark.parametrize("label", sorted(NOT_MODULES))
def test_unwrap_subclass_parameters_refuses_a_non_module(label):
    value = NOT_MODULES[label]
    found = {"None": "NoneType", "int": "int", "tensor": "subclasses.MeshTensor", "class": "type", "list": "list"}
    _raises(
        lambda: osc.unwrap_subclass_parameters(value),
        OpaqueTypeError,
        "opaque_subclass.unwrap_subclass_parameters",
        "torch.nn.Module",
        found[label],
    )


def test_unwrap_subclass_parameters_fix_for_a_tensor_runs():
    t = MeshTensor(torch.ones(2), Mesh())
    text = _raises(lambda: osc.unwrap_subclass_parameters(t), OpaqueTypeError, "subclasses.MeshTensor")
    scope: dict[str, Any] = {"t": t}
    exec(_snippets(text)[0], scope)
    assert scope["module"].weight._mesh is t._mesh


@pytest.mark.parametrize(
    "function",
    ["check_graph", "baked_objects", "lint_baked", "opaque_check"],
)
def test_compile_passes_refuse_a_non_graph_module(function):
    call = getattr(compile_passes, function)
    args = (torch.nn.Linear(1, 1), []) if function == "opaque_check" else (torch.nn.Linear(1, 1),)
    text = _raises(lambda: call(*args), OpaqueTypeError, f"compile_passes.{function}", "torch.fx.GraphModule", "Linear")
    scope: dict[str, Any] = {"model": torch.nn.Linear(1, 1)}
    if function == "opaque_check":
        return  # a backend: torch passes the graph module
    exec(_snippets(text)[0], scope)


def test_shard_module_refuses_a_non_module():
    from opaque_subclass.sharded import shard_module

    _raises(lambda: shard_module(None, None, {}), OpaqueTypeError, "shard_module", "NoneType")


# ------------------------------------ (e) an opaque whose __getattr__ answers all


class Itself(osc.OpaqueBase):
    """Every attribute it lacks is the object itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Itself({self.name!r})"

    def __getattr__(self, name: str) -> Any:
        return self


class ForeignAnything:
    """Like Anything, without inheriting OpaqueBase (as DeviceMesh on 2.11)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


for _cls in (Itself, ForeignAnything):
    osc.register_opaque(_cls)

ANSWERING = [Anything, Itself, ForeignAnything]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", ANSWERING, ids=lambda c: c.__name__)
def test_compile_with_an_opaque_answering_every_name(backend, cls):
    f = _compiled(backend, lambda t: t * 2)
    for name in ("one", "two"):
        obj = cls(name)
        out = f(MeshTensor(torch.ones(2), obj))
        assert type(out) is MeshTensor and out._mesh is obj and torch.equal(out._data, torch.full((2,), 2.0))
    # the API never asked the instance either
    leaves, spec = osc.flatten_subclass(MeshTensor(torch.ones(2), obj))
    assert leaves[1] is obj and osc.unflatten_subclass(leaves, spec)._mesh is obj


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", ANSWERING, ids=lambda c: c.__name__)
def test_compile_with_an_answering_opaque_as_an_argument_and_an_output(backend, cls):
    f = _compiled(backend, lambda t, m: (t * 2, m))
    obj = cls("arg")
    assert f(torch.ones(2), obj)[1] is obj
    g = _compiled(backend, lambda t: (t * 3, t._mesh))
    x = MeshTensor(torch.ones(2), cls("attr")).requires_grad_()
    out, held = g(x)
    assert held is x._mesh
    out.sum().backward()
    assert x.grad._mesh is x._mesh


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_code_using_an_undeclared_member_of_an_answering_opaque_is_named(backend):
    f = _compiled(backend, lambda t: t * 2 if t._mesh.scale() is not None else t)
    _raises(lambda: f(MeshTensor(torch.ones(2), Anything("m"))), osc.OpaqueMemberError, "Anything", "scale")


@pytest.mark.parametrize("cls", ANSWERING, ids=lambda c: c.__name__)
def test_strict_export_with_an_opaque_answering_every_name(cls):
    class Double(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t * 2

    ep = torch.export.export(Double(), (MeshTensor(torch.ones(2), cls("traced")),), strict=True)
    obj = cls("called")
    assert ep.module()(MeshTensor(torch.ones(2), obj))._mesh is obj
