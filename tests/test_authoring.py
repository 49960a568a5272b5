"""OpaqueSubclass: declarations checked at class definition, construction,
flatten protocol, repr, autograd behaviour and dispatch."""

import pytest
import torch
from subclasses import Config, Mesh, NotRegistered, Stream
from torch._subclasses.fake_tensor import FakeTensorMode

import opaque_subclass as osc
from opaque_subclass import OpaqueSubclass


class Tagged(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_tag",)


class Pair(OpaqueSubclass):
    tensor_attrs = ("_a", "_b")
    opaque_attrs = {"_mesh": Mesh, "_stream": Stream}


# ---------------------------------------------------------------- declarations


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "declares no tensor_attrs"),
        (
            {"tensor_attrs": "_data"},
            "must be a tuple of names, got the string '_data'. Fix: `tensor_attrs = ('_data',)`",
        ),
        (
            {"tensor_attrs": ("_d", "_d2"), "meta_attrs": ("_d",)},
            "'_d' is declared in both tensor_attrs and meta_attrs",
        ),
        ({"tensor_attrs": ("data",)}, "would shadow torch.Tensor.data. Fix: rename it, e.g. '_data'"),
        (
            {"tensor_attrs": ("_d",), "opaque_attrs": {"_m": NotRegistered}},
            'is not a registered opaque type. Fix: register it before defining the class: `import opaque_subclass; from subclasses import NotRegistered; opaque_subclass.register_opaque(NotRegistered, kind="reference")`',
        ),
        (
            {"tensor_attrs": ("_d",), "opaque_attrs": {"_c": Config}},
            "a value-type opaque. Value opaques are constants compiled into the graph. Fix: declare '_c' in meta_attrs",
        ),
        ({"tensor_attrs": ("_d",), "opaque_attrs": ["_m"]}, "opaque_attrs must map names to opaque classes"),
        ({"tensor_attrs": ("1x",)}, "is not a valid attribute name"),
    ],
)
def test_bad_declarations_fail_at_class_definition(body, message):
    with pytest.raises(TypeError) as info:
        type("Bad", (OpaqueSubclass,), dict(body))
    assert "test_authoring.Bad" in str(info.value) or "Bad" in str(info.value)
    assert message in str(info.value)


@pytest.mark.parametrize("value_type, value", [(int, 4), (str, "fp8"), (torch.dtype, torch.float16)])
def test_a_plain_value_type_in_opaque_attrs_suggests_meta_attrs(value_type, value):
    """int, str or a torch value type cannot be registered as an opaque (register_opaque
    refuses them), so the fix is metadata; the fix runs as written."""
    with pytest.raises(TypeError) as info:
        type("Bad", (OpaqueSubclass,), {"tensor_attrs": ("_d",), "opaque_attrs": {"_n": value_type}})
    msg = str(info.value)
    assert f"opaque_attrs['_n'] is {value_type.__module__}.{value_type.__qualname__}, a plain value type" in msg
    assert "Fix: declare '_n' in meta_attrs" in msg and "register_opaque(" not in msg, msg
    fixed = type("Fixed", (OpaqueSubclass,), {"tensor_attrs": ("_d",), "meta_attrs": ("_n",)})
    x = fixed(torch.ones(2), value)
    assert x._n == value and osc.flatten_subclass(x)[1].meta == (value,)


def test_a_tensor_class_in_opaque_attrs_suggests_tensor_attrs():
    with pytest.raises(
        TypeError, match=r"opaque_attrs\['_t'\] is torch\.Tensor, a tensor class\. Fix: declare '_t' in tensor_attrs"
    ):
        type("Bad", (OpaqueSubclass,), {"tensor_attrs": ("_d",), "opaque_attrs": {"_t": torch.Tensor}})


def test_flatten_protocol_and_round_trip():
    m = Mesh("a")
    x = Tagged(torch.arange(3.0), m, "t")
    assert x.__tensor_flatten__() == (["_data", "_mesh"], ("t",))
    leaves, spec = osc.flatten_subclass(x)
    assert leaves[1] is m and spec.meta == ("t",)
    y = osc.unflatten_subclass(leaves, spec)
    assert type(y) is Tagged and y._mesh is m and y._tag == "t" and torch.equal(y._data, x._data)


def test_keyword_construction_and_outer_size():
    m = Mesh()
    x = Tagged(_data=torch.ones(2, 3), _mesh=m, _tag=1, outer_size=(4, 3))
    assert x.shape == (4, 3) and x.stride() == (3, 1) and x._data.shape == (2, 3)
    leaves, spec = osc.flatten_subclass(x)
    assert spec.outer_size == (4, 3)
    assert osc.unflatten_subclass(leaves, spec).shape == (4, 3)


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (lambda: Tagged(torch.ones(1), Mesh()), TypeError, "missing '_tag'"),
        (lambda: Tagged(torch.ones(1), Mesh(), 1, 2), TypeError, "takes 3 values"),
        (lambda: Tagged(torch.ones(1), Mesh(), 1, extra=2), TypeError, "unexpected argument 'extra'"),
        (
            lambda: Tagged(torch.ones(1), Stream(), 1),
            TypeError,
            "Tagged._mesh must be a subclasses.Mesh (declared in opaque_attrs), got subclasses.Stream",
        ),
        (lambda: Tagged(3, Mesh(), 1), TypeError, "Tagged._data must be a tensor"),
        (
            lambda: Tagged(torch.ones(1, requires_grad=True), Mesh(), 1, requires_grad=True),
            ValueError,
            "requires_grad=True asks for a leaf, but the inner tensor '_data' requires grad",
        ),
        (lambda: OpaqueSubclass(torch.ones(1)), TypeError, "is a base class"),
    ],
)
def test_bad_construction(call, exc, message):
    with pytest.raises(exc, match=None) as info:
        call()
    assert message in str(info.value)


def test_repr_never_reads_data():
    mode = FakeTensorMode()
    real = torch.ones(2)
    with mode:
        fake = Tagged(mode.from_tensor(real), Mesh(), "t")
        text = repr(fake)
    assert text == "Tagged(shape=(2,), dtype=torch.float32, _mesh=Mesh, _tag='t')"


def test_autograd_behaves_like_a_plain_tensor():
    m = Mesh()
    x = Tagged(torch.arange(3.0), m, "t", requires_grad=True)
    assert x.is_leaf and x.requires_grad and not x._data.requires_grad
    (x * x).sum().backward()
    assert type(x.grad) is Tagged and x.grad._mesh is m and torch.equal(x.grad._data, 2 * torch.arange(3.0))
    d = x.detach()
    assert type(d) is Tagged and not d.requires_grad and d._mesh is m
    y = Tagged(torch.ones(2), m, "t")
    assert not y.requires_grad and y.requires_grad_() is y and y.requires_grad and y.is_leaf
    z = y * 2
    assert not z.is_leaf and z.grad_fn is not None


def test_inner_tensor_requiring_grad_makes_construction_differentiable():
    p = torch.nn.Parameter(torch.arange(3.0))
    x = Tagged(p, Mesh(), "t")
    assert not x.is_leaf and not x._data.requires_grad
    (x * 2).sum().backward()
    assert torch.equal(p.grad, torch.full((3,), 2.0))


def test_from_inner_is_differentiable_wrt_inner():
    inner = torch.arange(3.0, requires_grad=True)
    x = Tagged.from_inner(inner, Mesh(), "t")
    assert type(x) is Tagged and not x._data.requires_grad
    (x * 3).sum().backward()
    assert torch.equal(inner.grad, torch.full((3,), 3.0))


def test_default_rule_rewraps_with_opaques_and_meta():
    m = Mesh()
    x = Pair(torch.ones(2), torch.zeros(2), m, Stream(1))
    y = x + 1
    assert (
        type(y) is Pair
        and y._mesh is m
        and torch.equal(y._a, torch.full((2,), 2.0))
        and torch.equal(y._b, torch.ones(2))
    )
    x.mul_(3)
    assert torch.equal(x._a, torch.full((2,), 3.0))
    v = x.view(2, 1)
    assert type(v) is Pair and v.shape == (2, 1)


def test_default_rule_rejects_different_opaques_and_meta():
    with pytest.raises(
        osc.OpaqueSubclassError, match="whose '_mesh' are different subclasses.Mesh objects.*@Tagged.implements"
    ):
        Tagged(torch.ones(1), Mesh(), "t") + Tagged(torch.ones(1), Mesh(), "t")
    m = Mesh()
    with pytest.raises(osc.OpaqueSubclassError, match="different '_tag' \\('a' and 'b'\\)"):
        Tagged(torch.ones(1), m, "a") + Tagged(torch.ones(1), m, "b")


def test_op_table_per_class_and_inherited():
    class Counting(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}

    calls = []

    @Counting.implements(torch.ops.aten.mul.Tensor)
    def _mul(func, args, kwargs):
        calls.append(func)
        a, b = args
        return a.wrap_like(_data=a._data * (b._data if isinstance(b, Counting) else b) + 100)

    class Child(Counting):
        pass

    m = Mesh()
    out = Child(torch.ones(1), m) * 2
    assert calls == [torch.ops.aten.mul.Tensor] and out._data.item() == 102.0
    assert (Tagged(torch.ones(1), m, "t") * 2)._data.item() == 2.0  # other classes unaffected
    with pytest.raises(TypeError, match="not for the base class. Fix: call it on your subclass, `import torch; "):
        OpaqueSubclass.implements(torch.ops.aten.mul.Tensor)


def test_compile_forward_backward_with_runtime_opaques():
    f = torch.compile(lambda x: (x * x).sum(), backend="aot_eager", fullgraph=True)
    for i in range(2):
        m = Mesh(str(i))
        x = Tagged(torch.arange(3.0), m, "t", requires_grad=True)
        f(x).backward()
        assert x.grad._mesh is m


@pytest.mark.parametrize("backward", [False, True], ids=["fw", "fwbw"])
def test_mark_dynamic_on_a_nested_subclass_compiles_once(backward):
    """``mark_dynamic`` on a ``Tagged`` inside a ``Tagged``: torch fakeifies the inner one
    with its concrete size as ``outer_size``; the class takes its shape from its symbolic
    tensor instead, so three sizes compile once, each output (and gradient) on its call's
    meshes at both levels. Before: ``ConstraintViolationError`` on every release."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    count = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda t: (t * 2).sum() if backward else t * 2, backend=count, fullgraph=True)
    for n in (2, 3, 5):
        inner, outer = Mesh(f"in {n}"), Mesh(f"out {n}")
        x = Tagged(Tagged(torch.arange(float(n)), inner, "in"), outer, "out", requires_grad=backward)
        torch._dynamo.mark_dynamic(x, 0)
        y = f(x)
        if backward:
            y.backward()
            y = x.grad
            assert torch.equal(y._data._data, torch.full((n,), 2.0))
        else:
            assert torch.equal(y._data._data, torch.arange(float(n)) * 2)
        assert type(y) is Tagged and type(y._data) is Tagged and y.shape == (n,)
        assert y._mesh is outer and y._data._mesh is inner
    assert count.frame_count == 1
    torch._dynamo.reset()


def test_register_opaques_defers_registration_to_the_first_instance():
    """``register_opaques=True``: declaring the class registers nothing; the
    first instance registers its opaque classes as reference opaques."""
    from opaque_subclass.core.registry import opaque_kind

    class Handle:  # nobody registered it
        pass

    class Held(OpaqueSubclass, register_opaques=True):
        tensor_attrs = ("_d",)
        opaque_attrs = {"_h": Handle}

    assert opaque_kind(Handle) is None
    h = Handle()
    x = Held(torch.ones(2), h)
    assert opaque_kind(Handle) == "reference"
    assert x._h is h and x.__tensor_flatten__()[0] == ["_d", "_h"]
    f = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
    assert f(x)._h is h


def test_register_opaques_refuses_a_class_registered_as_value_meanwhile():
    class Late:
        def __eq__(self, other):
            return isinstance(other, Late)

        def __hash__(self):
            return 0

        def __fx_repr__(self):
            return "Late()", {"Late": Late}

    class Held(OpaqueSubclass, register_opaques=True):
        tensor_attrs = ("_d",)
        opaque_attrs = {"_h": Late}

    osc.register_opaque(Late, kind="value")
    with pytest.raises(
        TypeError, match=r"Held: .*Late was registered as a value-type opaque after the class was declared.*Fix:"
    ):
        Held(torch.ones(2), Late())


def test_unregistered_opaque_error_names_register_opaques():
    with pytest.raises(TypeError, match="register_opaques=True"):
        type("Bad", (OpaqueSubclass,), {"tensor_attrs": ("_d",), "opaque_attrs": {"_m": NotRegistered}})
