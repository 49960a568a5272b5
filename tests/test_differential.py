"""Programs without opaques behave exactly as on stock torch, with the
library's patches (torch 2.11) and fixes (native releases) on or off.

Each test runs an opaque-free program (torch's own ``TwoTensor`` subclass,
parametrizations of plain tensors) and compares it with stock torch
(``opaque_subclass.disable()``) or with torch's documented behaviour.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import opaque_subclass as osc


@contextlib.contextmanager
def _stock_torch():
    osc.disable()
    try:
        yield
    finally:
        osc.enable()


def _graph_capturing_backend(graphs: list[str]):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def compiler(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm.code.strip())
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)


def _run_twin(graphs: list[str]):
    """A TwoTensor program with a backward: outputs, gradients."""
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: (x * y + x.sin()).sum(), backend=_graph_capturing_backend(graphs), fullgraph=True)
    a = TwoTensor(torch.arange(3.0), torch.arange(3.0) + 1).requires_grad_(True)
    b = TwoTensor(torch.ones(3), torch.full((3,), 2.0))
    out = f(a, b)
    out.backward()
    return out, a.grad


def test_opaque_free_twin_same_outputs_and_graphs_as_stock():
    ours: list[str] = []
    out, grad = _run_twin(ours)
    stock: list[str] = []
    with _stock_torch():
        ref_out, ref_grad = _run_twin(stock)
    torch._dynamo.reset()
    assert type(out) is type(ref_out) and torch.equal(out.a, ref_out.a) and torch.equal(out.b, ref_out.b)
    assert type(grad) is TwoTensor and torch.equal(grad.a, ref_grad.a) and torch.equal(grad.b, ref_grad.b)
    assert len(ours) == 2 and ours == stock  # forward and backward graphs, same text


class _TwoLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        w = torch.arange(12.0).reshape(3, 4) / 10
        self.weight = torch.nn.Parameter(TwoTensor(w, w + 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)


def test_inductor_freezing_of_subclass_parameters_runs():
    """torch._inductor.config.freezing with TwoTensor parameters (the path
    torchao-style inference uses): frozen parameters reach the per-call wrapper
    as None; the library's 2.11 wrapper used to refuse them."""
    module = _TwoLinear().eval()
    x = torch.ones(2, 4)
    with torch.no_grad():
        expected = module(x)
        torch._dynamo.reset()
        with torch._inductor.config.patch(freezing=True):
            got = torch.compile(module, backend="inductor")(x)
    torch._dynamo.reset()
    assert type(got) is TwoTensor
    assert torch.allclose(got.a, expected.a) and torch.allclose(got.b, expected.b)


class _FrozenBesideMesh(torch.nn.Module):
    """A TwoTensor parameter (frozen by inductor's freezing) beside a MeshTensor input (an opaque
    slot, so the graph runs the library's generated unwrap on torch 2.11)."""

    def __init__(self) -> None:
        super().__init__()
        w = torch.arange(12.0).reshape(3, 4) / 10
        self.weight = torch.nn.Parameter(TwoTensor(w, w + 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.nn.functional.linear(torch.ones(2, 4), self.weight), x * 2


def test_inductor_freezing_beside_an_opaque_input_runs():
    """A frozen subclass parameter reaches the per-call wrapper as None next to an input holding
    an opaque: the generated unwrap refuses None at a subclass slot, and the call goes to torch's
    function (it used to be looked for before every call)."""
    from subclasses import Mesh, MeshTensor

    module = _FrozenBesideMesh().eval()
    mesh = Mesh("frozen-beside")
    x = MeshTensor(torch.ones(2, 4), mesh)
    with torch.no_grad():
        expected = module(x)
        torch._dynamo.reset()
        with torch._inductor.config.patch(freezing=True):
            compiled = torch.compile(module, backend="inductor")
            got = compiled(x)
            other = Mesh("frozen-beside-2")
            again = compiled(MeshTensor(torch.ones(2, 4) * 3, other))
    torch._dynamo.reset()
    assert type(got[0]) is TwoTensor and torch.allclose(got[0].a, expected[0].a)
    assert torch.allclose(got[0].b, expected[0].b)
    assert type(got[1]) is MeshTensor and got[1]._mesh is mesh and torch.equal(got[1]._data, expected[1]._data)
    assert again[1]._mesh is other and torch.equal(again[1]._data, torch.full((2, 4), 6.0))


class _NoneFirst(torch.nn.Module):
    def forward(self, a, b):
        return b

    def right_inverse(self, z):
        return None, z


def test_parametrization_with_a_non_tensor_element_gets_torchs_own_error():
    from torch.nn.utils import parametrize

    module = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="of the sequence with type"):
        parametrize.register_parametrization(module, "weight", _NoneFirst())
    with _stock_torch():
        module = torch.nn.Linear(2, 2)
        with pytest.raises(ValueError, match="of the sequence with type"):
            parametrize.register_parametrization(module, "weight", _NoneFirst())
