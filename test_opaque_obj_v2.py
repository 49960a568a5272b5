"""End-to-end scenarios: tensor subclasses with opaque attributes through
torch.compile (Dynamo + AOTAutograd, aot_eager and inductor), compiled autograd
and identity guards; and through the torch APIs that walk ``__tensor_flatten__``
outside compilation: ``nn.utils.parametrize``, torch's subclass parametrization,
``torch.export`` (strict and non-strict), FSDP1's module-state sync and the
memory tools' storage accounting.

Written against plain torch APIs plus ``import opaque_subclass``: on torch >= 2.12
torch runs them natively, on torch 2.11 the backport does.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._dynamo.compiled_autograd
import torch._dynamo.testing
import torch._functorch.config
import torch._inductor.config
from expecttest import TestCase as ExpectTestCase
from torch.utils._pytree import tree_map_only

import opaque_subclass
from opaque_subclass import OpaqueBase

BACKENDS = ["aot_eager", "inductor"]


class Mesh(OpaqueBase):
    """A reference opaque standing in for a DeviceMesh: identity matters."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Mesh({self.name!r})"


opaque_subclass.register_opaque(Mesh)


class MeshTensor(torch.Tensor):
    """A wrapper subclass whose ``__tensor_flatten__`` lists an opaque attribute."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, mesh: Any) -> MeshTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            dtype=data.dtype,
            device=data.device,
            requires_grad=data.requires_grad,
        )
        r._data = data
        r._mesh = mesh
        return r

    def __init__(self, data: torch.Tensor, mesh: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"MeshTensor(shape={tuple(self.shape)})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_data", "_mesh"], None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: None, size: Any, stride: Any) -> MeshTensor:
        return cls(inner["_data"], inner["_mesh"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        mesh = next(a._mesh for a in tree_leaves_of(args) if isinstance(a, MeshTensor))
        out = func(
            *tree_map_only(MeshTensor, lambda t: t._data, args),
            **tree_map_only(MeshTensor, lambda t: t._data, kwargs or {}),
        )
        return tree_map_only(torch.Tensor, lambda t: cls(t, mesh), out)


def tree_leaves_of(args: Any) -> list[Any]:
    return torch.utils._pytree.tree_leaves(args)


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


class NotRegistered:
    pass


class Config(OpaqueBase):
    """A value-type opaque: belongs in the flatten context, not the attribute list."""

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and other.bits == self.bits

    def __hash__(self) -> int:
        return hash(self.bits)

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        return f"Config({self.bits})", {"Config": Config}


opaque_subclass.register_opaque(Config, kind="value")


@pytest.mark.parametrize(
    "bad, found, fix",
    [
        (
            NotRegistered(),
            "test_opaque_obj_v2.NotRegistered",
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
    with pytest.raises(Exception) as info:
        f(x)
    if opaque_subclass.support().mode != "backport":
        return  # torch's own message: not ours to word
    msg = str(info.value)
    assert "MeshTensor.__tensor_flatten__() lists attribute '_mesh'" in msg
    assert "L['x']._mesh" in msg and found in msg and fix in msg
    assert "is_nested" not in msg


class GraphTest(ExpectTestCase):
    def test_aot_graphs_show_opaque_placeholders(self):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        graphs: dict[str, str] = {}

        def keep(name):
            def compiler(gm, example_inputs):
                graphs[name] = gm.code.strip()
                return make_boxed_func(gm.forward)

            return compiler

        backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))
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


# ---------------------------------------------------------------- modules: parametrize, export, FSDP, storage
#
# Plain torch APIs that walk ``__tensor_flatten__`` outside torch.compile.


class ExportableMeshTensor(MeshTensor):
    """A MeshTensor whose construction torch.export can record while tracing (so an
    exported program may rebuild it from a parametrization's leaves)."""

    @torch._disable_dynamo
    @torch._export.wrappers.mark_subclass_constructor_exportable_experimental
    def __init__(self, data: torch.Tensor, mesh: Any) -> None:
        pass


class Scale(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x + 1


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
    from torch._functorch._aot_autograd.subclass_parametrization import unwrap_tensor_subclass_parameters

    inner, outer = Mesh("inner"), Mesh("outer")
    module = unwrap_tensor_subclass_parameters(Scale(MeshTensor(MeshTensor(torch.arange(3.0), inner), outer)))
    plist = module.parametrizations.w
    assert plist.original1 is inner and plist.original2 is outer
    assert list(module.state_dict()) == ["parametrizations.w.original0"]
    w = module.w
    assert w._mesh is outer and w._data._mesh is inner and torch.equal(w._data._data, torch.arange(3.0))
    # Compiled, the rebuilt parameter carries the module's opaques (graph inputs
    # read from the module), and a new opaque assigned later is used without
    # recompiling.
    cnt = _counter(backend)
    compiled = torch.compile(module, backend=cnt, fullgraph=True)
    with torch.no_grad():
        out = compiled(torch.full((3,), 2.0))
        assert out._mesh is outer and out._data._mesh is inner
        torch.testing.assert_close(out._data._data, torch.arange(3.0) * 2 + 1)
        plist.original2 = replaced = Mesh("replaced")
        out = compiled(torch.full((3,), 2.0))
    assert out._mesh is replaced and out._data._mesh is inner
    assert cnt.frame_count == 1


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
    from torch.distributed._tools.common_utils import get_untyped_storages

    data, inner_data = torch.ones(4), torch.zeros(2)
    x = MeshTensor(data, Mesh("s"))
    nested = MeshTensor(MeshTensor(inner_data, Mesh("in")), Mesh("out"))
    with warnings.catch_warnings():
        # torch 2.11 without the backport warns "Expected a tensor ..." for each opaque.
        warnings.simplefilter("error")
        assert get_untyped_storages(x) == {data.untyped_storage()}
        assert get_untyped_storages(nested) == {inner_data.untyped_storage()}


def test_fsdp1_module_state_sync_keeps_opaques():
    # FSDP1's sync_module_states is GPU-only in torch; its device check is
    # bypassed here so that the walk itself runs on CPU (one gloo process).
    import socket
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.fsdp import _init_utils

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    check = _init_utils._check_module_states_for_sync_module_states
    _init_utils._check_module_states_for_sync_module_states = lambda states: None
    try:
        mesh, inner = Mesh("fsdp"), Mesh("fsdp-inner")
        module = Scale(MeshTensor(MeshTensor(torch.arange(3.0), inner), mesh))
        module.register_buffer("b", MeshTensor(torch.ones(2), mesh))
        _init_utils._sync_module_params_and_buffers(module, list(module.parameters()), dist.group.WORLD)
        assert module.w._mesh is mesh and module.w._data._mesh is inner and module.b._mesh is mesh
        assert torch.equal(module.w._data._data, torch.arange(3.0))
    finally:
        _init_utils._check_module_states_for_sync_module_states = check
        dist.destroy_process_group()
