"""End-to-end scenarios: tensor subclasses with opaque attributes through
torch.compile (Dynamo + AOTAutograd, aot_eager and inductor), compiled autograd
and identity guards; and through the torch APIs that walk ``__tensor_flatten__``
outside compilation: ``nn.utils.parametrize``, torch's subclass parametrization,
``torch.export`` (strict and non-strict), FSDP1's module-state sync and the
memory tools' storage accounting.

Written against plain torch APIs plus ``import opaque_subclass``: on torch >= 2.12
torch runs them natively, on torch 2.11 the backport does. The opaque classes and
subclasses are the test suite's fixtures (``tests/subclasses.py``); scenario
bodies that other test modules run too live in ``tests/scenarios.py`` (the
root ``conftest.py`` puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
import torch._dynamo.compiled_autograd
import torch._dynamo.testing
import torch._functorch.config
import torch._inductor.config
from expecttest import TestCase as ExpectTestCase
from scenarios import (
    Scale,
    fsdp1_module_state_sync_keeps_opaques,
    storage_accounting_skips_opaques,
    torch_subclass_parametrization_keeps_opaques,
)
from subclasses import Config, Mesh, MeshTensor, NotRegistered

import opaque_subclass

BACKENDS = ["aot_eager", "inductor"]


class _FromLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, data: torch.Tensor, mesh: Any) -> MeshTensor:  # type: ignore[override]
        return MeshTensor(data, mesh)

    @staticmethod
    def backward(ctx: Any, grad: MeshTensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad._data, None


def from_local(data: torch.Tensor, mesh: Any) -> MeshTensor:
    return _FromLocal.apply(data, mesh)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # torch's compile caches stay on (the nox legs give each test process its
    # own empty TORCHINDUCTOR_CACHE_DIR); only Dynamo's in-memory frame cache
    # is reset, so that each scenario counts its own compilations.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _counter(backend: str) -> torch._dynamo.testing.CompileCounterWithBackend:
    return torch._dynamo.testing.CompileCounterWithBackend(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_uses_runtime_opaque_and_compiles_once(backend):
    cnt = _counter(backend)
    f = torch.compile(lambda x: x * 2 + 1, backend=cnt, fullgraph=True)
    for i in range(5):
        mesh = Mesh(f"m{i}")
        out = f(MeshTensor(torch.full((3,), float(i)), mesh))
        assert type(out) is MeshTensor
        assert out._mesh is mesh
        torch.testing.assert_close(out._data, torch.full((3,), 2.0 * i + 1))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_grad_carries_runtime_opaque(backend):
    cnt = _counter(backend)
    f = torch.compile(lambda x: (x * x).sum(), backend=cnt, fullgraph=True)
    for i in range(2):
        mesh = Mesh(f"g{i}")
        x = MeshTensor(torch.arange(3.0) + i, mesh).requires_grad_(True)
        f(x).backward()
        assert type(x.grad) is MeshTensor
        assert x.grad._mesh is mesh
        torch.testing.assert_close(x.grad._data, 2 * (torch.arange(3.0) + i))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_takes_input_opaque_not_tangent_opaque(backend):
    f = torch.compile(lambda x: (x * 2).sum(), backend=backend, fullgraph=True)
    mesh = Mesh("input")
    x = MeshTensor(torch.ones(3), mesh).requires_grad_(True)
    f(x).backward(MeshTensor(torch.ones(()), Mesh("tangent")))
    assert x.grad._mesh is mesh
    torch.testing.assert_close(x.grad._data, torch.full((3,), 2.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_autograd_backward(backend):
    f = torch.compile(lambda x: (x * 3).sum(), backend=backend, fullgraph=True)
    grads = []
    for i in range(2):
        mesh = Mesh(f"ca{i}")
        x = MeshTensor(torch.ones(4) * i, mesh).requires_grad_(True)
        loss = f(x)
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend)):
            loss.backward()
        assert type(x.grad) is MeshTensor and x.grad._mesh is mesh
        grads.append(x.grad._data)
    for g in grads:
        torch.testing.assert_close(g, torch.full((4,), 3.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_opaque_identity_guard(backend):
    cnt = _counter(backend)
    f = torch.compile(lambda x, y: (x + y, y * 2), backend=cnt, fullgraph=True)
    shared = Mesh("shared")
    out = f(MeshTensor(torch.ones(2), shared), MeshTensor(torch.ones(2), shared))
    assert out[0]._mesh is shared and out[1]._mesh is shared
    assert cnt.frame_count == 1

    a, b = Mesh("a"), Mesh("b")
    out = f(MeshTensor(torch.ones(2), a), MeshTensor(torch.ones(2), b))
    assert out[0]._mesh is a and out[1]._mesh is b
    assert cnt.frame_count == 2

    again = Mesh("again")
    out = f(MeshTensor(torch.ones(2), again), MeshTensor(torch.ones(2), again))
    assert out[0]._mesh is again and out[1]._mesh is again
    c, d = Mesh("c"), Mesh("d")
    out = f(MeshTensor(torch.ones(2), c), MeshTensor(torch.ones(2), d))
    assert out[0]._mesh is c and out[1]._mesh is d
    assert cnt.frame_count == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_direct_opaque_identity_guard(backend):
    cnt = _counter(backend)
    f = torch.compile(lambda x, m: (x * 2, m), backend=cnt, fullgraph=True)
    m = Mesh("direct")
    out, got = f(MeshTensor(torch.ones(2), m), m)
    assert out._mesh is m and got is m
    m1, m2 = Mesh("1"), Mesh("2")
    out, got = f(MeshTensor(torch.ones(2), m1), m2)
    assert out._mesh is m1 and got is m2
    assert cnt.frame_count == 2
    m3 = Mesh("3")
    out, got = f(MeshTensor(torch.ones(2), m3), m3)
    assert out._mesh is m3 and got is m3
    assert cnt.frame_count == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_subclass_opaques_at_each_level(backend):
    cnt = _counter(backend)
    f = torch.compile(lambda x: x + 1, backend=cnt, fullgraph=True)
    for i in range(3):
        inner_mesh, outer_mesh = Mesh(f"inner{i}"), Mesh(f"outer{i}")
        x = MeshTensor(MeshTensor(torch.ones(2) * i, inner_mesh), outer_mesh)
        out = f(x)
        assert out._mesh is outer_mesh
        assert type(out._data) is MeshTensor and out._data._mesh is inner_mesh
        torch.testing.assert_close(out._data._data, torch.ones(2) * i + 1)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_subclass_created_inside_and_opaque_returned(backend):
    cnt = _counter(backend)

    def fn(data, mesh):
        y = from_local(data * 2, mesh)
        return y + 1, mesh

    f = torch.compile(fn, backend=cnt, fullgraph=True)
    for i in range(3):
        mesh = Mesh(f"made{i}")
        out, got = f(torch.ones(2) * i, mesh)
        assert type(out) is MeshTensor and out._mesh is mesh and got is mesh
        torch.testing.assert_close(out._data, torch.ones(2) * 2 * i + 1)
    assert cnt.frame_count == 1


@pytest.mark.parametrize(
    "bad, found, fix",
    [
        (
            NotRegistered(),
            "subclasses.NotRegistered",
            'opaque_subclass.register_opaque(NotRegistered, kind="reference")',
        ),
        (3, "holds int", "move '_mesh' into the flatten context"),
        (Config(4), "a value-type opaque", "return it in the context"),
    ],
    ids=["unregistered", "int", "value-opaque"],
)
def test_bad_attribute_is_a_clear_error(bad, found, fix):
    x = MeshTensor(torch.ones(2), Mesh("m"))
    x._mesh = bad
    f = torch.compile(lambda x: x + 1, backend="aot_eager", fullgraph=True)
    # The library's error on every supported torch (the backport on 2.11, a
    # native-mode fix of Dynamo's check on 2.12 and newer), as itself: the
    # library's fix of Dynamo's _compile does not let Dynamo wrap it.
    with pytest.raises(opaque_subclass.OpaqueTypeError) as info:
        f(x)
    msg = str(info.value)
    assert "MeshTensor.__tensor_flatten__() lists attribute '_mesh'" in msg
    assert "L['x']._mesh" in msg and found in msg and fix in msg
    assert "is_nested" not in msg


def _capturing_backend() -> tuple[dict[str, str], Any]:
    """An aot_eager-like backend that keeps the code of the forward ("fw") and
    backward ("bw") graphs AOTAutograd hands it; the same text on torch 2.11 -
    2.15 (checked on each)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: dict[str, str] = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm.code.strip()
            return make_boxed_func(gm.forward)

        return compiler

    return graphs, aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))


class GraphTest(ExpectTestCase):
    def test_aot_graphs_show_opaque_placeholders(self):
        graphs, backend = _capturing_backend()
        f = torch.compile(lambda x: (x * x).sum(), backend=backend, fullgraph=True)
        mesh = Mesh("graph")
        x = MeshTensor(torch.ones(3), mesh).requires_grad_(True)
        f(x).backward()
        assert x.grad._mesh is mesh
        # primals_2 is the opaque: a placeholder, returned as the output's opaque
        # and saved for backward, where the gradient's opaque is read from it.
        self.assertExpectedInline(
            graphs["fw"],
            """\
def forward(self, primals_1, primals_2):
    mul = torch.ops.aten.mul.Tensor(primals_1, primals_1)
    sum_1 = torch.ops.aten.sum.default(mul);  mul = None
    return (sum_1, primals_2, primals_1, primals_2)""",
        )
        self.assertExpectedInline(
            graphs["bw"],
            """\
def forward(self, primals_1, primals_2, tangents_1, tangents_2):
    expand = torch.ops.aten.expand.default(tangents_1, [3]);  tangents_1 = None
    mul_1 = torch.ops.aten.mul.Tensor(expand, primals_1)
    mul_2 = torch.ops.aten.mul.Tensor(expand, primals_1);  expand = primals_1 = None
    add = torch.ops.aten.add.Tensor(mul_2, mul_1);  mul_2 = mul_1 = None
    return (add, primals_2)""",
        )

    def test_nested_subclass_graphs_take_one_placeholder_per_level(self):
        graphs, backend = _capturing_backend()
        f = torch.compile(lambda x: (x * x).sum(), backend=backend, fullgraph=True)
        inner, outer = Mesh("inner"), Mesh("outer")
        x = MeshTensor(MeshTensor(torch.ones(3), inner), outer).requires_grad_(True)
        f(x).backward()
        assert x.grad._mesh is outer and x.grad._data._mesh is inner
        # Depth-first: primals_1 the innermost tensor, primals_2 the inner mesh,
        # primals_3 the outer one. Both meshes are returned (the output's, inner
        # then outer) and saved for backward, which gives the gradient's. The
        # loss's tangent is nested too: tangents_2/3 are its meshes, unused.
        self.assertExpectedInline(
            graphs["fw"],
            """\
def forward(self, primals_1, primals_2, primals_3):
    mul = torch.ops.aten.mul.Tensor(primals_1, primals_1)
    sum_1 = torch.ops.aten.sum.default(mul);  mul = None
    return (sum_1, primals_2, primals_3, primals_1, primals_2, primals_3)""",
        )
        self.assertExpectedInline(
            graphs["bw"],
            """\
def forward(self, primals_1, primals_2, primals_3, tangents_1, tangents_2, tangents_3):
    expand = torch.ops.aten.expand.default(tangents_1, [3]);  tangents_1 = None
    mul_1 = torch.ops.aten.mul.Tensor(expand, primals_1)
    mul_2 = torch.ops.aten.mul.Tensor(expand, primals_1);  expand = primals_1 = None
    add = torch.ops.aten.add.Tensor(mul_2, mul_1);  mul_2 = mul_1 = None
    return (add, primals_2, primals_3)""",
        )

    def test_inputs_sharing_an_opaque_keep_a_placeholder_each(self):
        graphs, backend = _capturing_backend()
        cnt = torch._dynamo.testing.CompileCounterWithBackend(backend)
        f = torch.compile(lambda x, y: x * y + y, backend=cnt, fullgraph=True)
        shared = Mesh("shared")
        out = f(MeshTensor(torch.ones(3), shared), MeshTensor(torch.full((3,), 2.0), shared))
        assert out._mesh is shared and torch.equal(out._data, torch.full((3,), 4.0))
        # Inference graph: arg0_1/arg1_1 are x's tensor and mesh, arg2_1/arg3_1
        # y's. The shared mesh keeps its two placeholders; the output's mesh is
        # x's (the first subclass argument of the multiplication).
        self.assertExpectedInline(
            graphs["fw"],
            """\
def forward(self, arg0_1, arg1_1, arg2_1, arg3_1):
    mul = torch.ops.aten.mul.Tensor(arg0_1, arg2_1);  arg0_1 = None
    add = torch.ops.aten.add.Tensor(mul, arg2_1);  mul = arg2_1 = None
    return (add, arg1_1)""",
        )
        # The graph was compiled for shared meshes: the sharing is guarded on.
        again = Mesh("again")
        assert f(MeshTensor(torch.ones(3), again), MeshTensor(torch.ones(3), again))._mesh is again
        assert cnt.frame_count == 1
        a, b = Mesh("a"), Mesh("b")
        assert f(MeshTensor(torch.ones(3), a), MeshTensor(torch.ones(3), b))._mesh is a
        assert cnt.frame_count == 2

    def test_backward_takes_the_tangent_opaque_and_returns_the_primal_one(self):
        graphs, backend = _capturing_backend()
        f = torch.compile(lambda x: x * 3, backend=backend, fullgraph=True)
        primal, tangent = Mesh("primal"), Mesh("tangent")
        x = MeshTensor(torch.ones(3), primal).requires_grad_(True)
        out = f(x)
        out.backward(MeshTensor(torch.ones(3), tangent))
        assert out._mesh is primal and x.grad._mesh is primal
        torch.testing.assert_close(x.grad._data, torch.full((3,), 3.0))
        # The forward returns the output's mesh and saves primals_2 (x's mesh)
        # for backward. The backward's inputs are the saved primals_2, then the
        # tangent's tensor and mesh (tangents_2, unused): the gradient carries
        # primals_2, never the tangent's mesh.
        self.assertExpectedInline(
            graphs["fw"],
            """\
def forward(self, primals_1, primals_2):
    mul = torch.ops.aten.mul.Tensor(primals_1, 3);  primals_1 = None
    return (mul, primals_2, primals_2)""",
        )
        self.assertExpectedInline(
            graphs["bw"],
            """\
def forward(self, primals_2, tangents_1, tangents_2):
    mul_1 = torch.ops.aten.mul.Tensor(tangents_1, 3);  tangents_1 = None
    return (mul_1, primals_2)""",
        )


# ---------------------------------------------------------------- modules: parametrize, export, FSDP, storage
#
# Plain torch APIs that walk ``__tensor_flatten__`` outside torch.compile.


class ExportableMeshTensor(MeshTensor):
    """A MeshTensor whose construction torch.export can record while tracing (so an
    exported program may rebuild it from a parametrization's leaves)."""

    @torch._disable_dynamo
    @torch._export.wrappers.mark_subclass_constructor_exportable_experimental
    def __init__(self, *values: Any, ctx: Any = None, outer: Any = None) -> None:
        pass

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        # Positional arguments only: the recorded constructor call takes no
        # ``ctx=None`` (torch 2.11's export refuses a None among its arguments).
        return cls(inner["_data"], inner["_mesh"])


class SplitMesh(torch.nn.Module):
    def forward(self, data: torch.Tensor, mesh: Any) -> MeshTensor:
        return MeshTensor(data, mesh)

    def right_inverse(self, value: MeshTensor) -> list[Any]:
        return [value._data, value._mesh]


def test_register_parametrization_stores_reference_opaque_as_attribute():
    from torch.nn.utils import parametrize

    mesh = Mesh("param")
    module = Scale(MeshTensor(torch.arange(3.0), mesh))
    parametrize.register_parametrization(module, "w", SplitMesh())
    plist = module.parametrizations.w
    assert plist.original1 is mesh and "original1" not in dict(plist.named_parameters())
    assert list(module.state_dict()) == ["parametrizations.w.original0"]
    assert module.w._mesh is mesh and torch.equal(module.w._data, torch.arange(3.0))
    assert [type(p) for p in module.parameters()] == [torch.nn.Parameter]
    new = Mesh("assigned")
    module.w = MeshTensor(torch.ones(3), new)
    assert plist.original1 is new and torch.equal(plist.original0, torch.ones(3))


def test_register_parametrization_refuses_value_opaque():
    from torch.nn.utils import parametrize

    class ReturnsConfig(SplitMesh):
        def right_inverse(self, value):
            return [value._data, Config(8)]

    module = Scale(MeshTensor(torch.ones(2), Mesh("v")))
    with pytest.raises(ValueError):
        parametrize.register_parametrization(module, "w", ReturnsConfig(), unsafe=True)
    assert not parametrize.is_parametrized(module, "w")


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_subclass_parametrization_keeps_opaques(backend):
    torch_subclass_parametrization_keeps_opaques(backend)


def test_torch_subclass_parametrization_refuses_value_opaque_attribute():
    from torch._functorch._aot_autograd.subclass_parametrization import unwrap_tensor_subclass_parameters

    x = MeshTensor(torch.ones(2), Mesh("m"))
    x._mesh = Config(4)
    with pytest.raises(ValueError) as info:
        unwrap_tensor_subclass_parameters(Scale(x))
    msg = str(info.value)
    assert "Config" in msg and "MeshTensor" in msg
    if opaque_subclass.support().mode == "backport":
        assert "lists attribute '_mesh'" in msg and "Fix:" in msg


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_subclass_input_and_parameter(strict):
    class Model(torch.nn.Module):
        def __init__(self, mesh):
            super().__init__()
            self.w = torch.nn.Parameter(MeshTensor(torch.arange(3.0), mesh))

        def forward(self, x):
            return self.w * x + 1

    w_mesh = Mesh("w")
    model = Model(w_mesh)
    x = MeshTensor(torch.ones(3), Mesh("traced"))
    ep = torch.export.export(model, (x,), strict=strict)
    run = MeshTensor(torch.full((3,), 2.0), Mesh("run"))
    out, expected = ep.module()(run), model(run)
    assert type(out) is MeshTensor and out._mesh is expected._mesh
    torch.testing.assert_close(out._data, expected._data)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_after_torch_subclass_parametrization(strict):
    from torch._functorch._aot_autograd.subclass_parametrization import unwrap_tensor_subclass_parameters
    from torch.export.graph_signature import InputKind

    mesh = Mesh("exported")
    module = unwrap_tensor_subclass_parameters(Scale(ExportableMeshTensor(torch.arange(3.0), mesh)))
    ep = torch.export.export(module, (torch.ones(3),), strict=strict)
    kinds = [(spec.kind, spec.target) for spec in ep.graph_signature.input_specs]
    assert kinds[0] == (InputKind.PARAMETER, "parametrizations.w.original0")
    assert [k for k, _ in kinds[1:]] == [InputKind.CUSTOM_OBJ, InputKind.USER_INPUT]
    assert all(type(p) is torch.nn.Parameter for p in ep.state_dict.values())
    (constant,) = ep.constants.values()
    assert constant is mesh
    x = torch.full((3,), 2.0)
    out = ep.module()(x)
    assert type(out) is ExportableMeshTensor and out._mesh is mesh
    torch.testing.assert_close(out._data, torch.arange(3.0) * 2 + 1)


def test_storage_accounting_skips_opaques():
    storage_accounting_skips_opaques()


def test_fsdp1_module_state_sync_keeps_opaques():
    fsdp1_module_state_sync_keeps_opaques()
