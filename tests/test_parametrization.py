"""unwrap_subclass_parameters and nn.utils.parametrize with opaques
(native on torch >= 2.12, backported on 2.11)."""

import pytest
import torch
import torch._dynamo.testing
from subclasses import Config, Mesh, MeshTensor, MultiOpaque, Stream, nested
from torch.nn.utils import parametrize

import opaque_subclass as osc
from opaque_subclass.modules.parametrization import UnwrapSubclass, unwrap_subclass_parameters

BACKPORT = osc.support().mode == "backport"


def _model(mesh):
    lin = torch.nn.Linear(3, 2)
    lin.weight = torch.nn.Parameter(MeshTensor(torch.randn(2, 3), mesh))
    lin.register_buffer("stats", nested(2, data=torch.zeros(4)))
    return lin


def test_parameters_and_buffers_become_plain_leaves():
    m = Mesh("w")
    lin = _model(m)
    inner_mesh = lin.stats._data._mesh
    unwrap_subclass_parameters(lin)
    assert type(lin.weight) is MeshTensor and lin.weight._mesh is m
    assert type(lin.stats) is MeshTensor and lin.stats._data._mesh is inner_mesh
    state = lin.state_dict()
    assert set(state) == {"bias", "parametrizations.weight.original0", "parametrizations.stats.original0"}
    assert all(type(v) in (torch.Tensor, torch.nn.Parameter) for v in state.values())
    names = dict(lin.named_parameters())
    assert set(names) == {"bias", "parametrizations.weight.original0"}
    assert lin.parametrizations.weight.original1 is m  # a plain attribute
    assert "original1" not in dict(lin.parametrizations.weight.named_parameters())
    assert (
        lin.parametrizations.stats.original1 is inner_mesh and lin.parametrizations.stats.original2 is lin.stats._mesh
    )


def test_requires_grad_follows_the_original_parameter():
    lin = torch.nn.Linear(2, 2)
    lin.weight = torch.nn.Parameter(MeshTensor(torch.randn(2, 2), Mesh()), requires_grad=False)
    unwrap_subclass_parameters(lin)
    assert lin.parametrizations.weight.original0.requires_grad is False
    lin2 = _model(Mesh())
    unwrap_subclass_parameters(lin2)
    assert lin2.parametrizations.weight.original0.requires_grad is True


def test_multi_opaque_and_idempotent():
    m, s = Mesh(), Stream(3)
    mod = torch.nn.Module()
    mod.p = torch.nn.Parameter(MultiOpaque(torch.ones(2), torch.zeros(2), m, s))
    unwrap_subclass_parameters(mod)
    unwrap_subclass_parameters(mod)  # already parametrized: unchanged
    assert mod.p._mesh is m and mod.p._stream is s
    assert len(mod.parametrizations.p) == 1


def test_assignment_updates_leaves_and_opaque():
    lin = _model(Mesh("a"))
    unwrap_subclass_parameters(lin)
    new = Mesh("b")
    lin.weight = MeshTensor(torch.zeros(2, 3), new)
    assert lin.weight._mesh is new and torch.equal(lin.parametrizations.weight.original0, torch.zeros(2, 3))


def test_forward_uses_rebuilt_subclass_with_same_opaque():
    m = Mesh()
    mod = torch.nn.Module()
    mod.w = torch.nn.Parameter(MeshTensor(torch.full((3,), 2.0), m))
    unwrap_subclass_parameters(mod)
    out = mod.w * 3
    assert type(out) is MeshTensor and out._mesh is m and torch.equal(out._data, torch.full((3,), 6.0))


def test_unwrap_parametrization_misuse():
    with pytest.raises(RuntimeError, match="before right_inverse"):
        UnwrapSubclass()(torch.ones(1))
    with pytest.raises(TypeError, match="expects a wrapper subclass"):
        UnwrapSubclass().right_inverse(torch.ones(1))


class _ReturnsValueOpaque(torch.nn.Module):
    def forward(self, data, cfg):
        return data

    def right_inverse(self, value):
        return [value, Config(8)]


def test_value_opaque_in_right_inverse_is_rejected():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError) as info:
        parametrize.register_parametrization(lin, "weight", _ReturnsValueOpaque(), unsafe=True)
    if BACKPORT:
        msg = str(info.value)
        assert "value-type opaque (subclasses.Config)" in msg and "element 1" in msg and "Fix:" in msg


class _WatchfulSplit(torch.nn.Module):
    """right_inverse returns [tensor, reference opaque] and checks that nobody
    has written a right_inverse of their own onto this instance."""

    def forward(self, data, mesh):
        return MeshTensor(data, mesh)

    def right_inverse(self, value):
        assert "right_inverse" not in vars(self), "the library wrote to the user's parametrization module"
        return [value._data, value._mesh]


def test_registering_never_writes_to_the_users_parametrization_module():
    from torch.nn.utils import parametrize

    lin = torch.nn.Linear(2, 2)
    mesh = Mesh("watch")
    lin.weight = torch.nn.Parameter(MeshTensor(torch.ones(2, 2), mesh))
    split = _WatchfulSplit()
    before = dict(vars(split))
    parametrize.register_parametrization(lin, "weight", split, unsafe=True)
    assert lin.parametrizations.weight[0] is split and vars(split).keys() == before.keys()
    assert lin.weight._mesh is mesh


class _Declared(osc.OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_tag",)


class _ScaleDeclared(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        self.w = torch.nn.Parameter(_Declared(torch.arange(3.0), mesh, "w"))

    def forward(self, x):
        return self.w * x + 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_forward_rebuilds_an_opaque_subclass_parameter(backend):
    """The parametrization rebuilds an OpaqueSubclass inside compiled code.
    Before the fix (torch 2.12 - 2.15), Dynamo inlined the class's __new__ and
    stopped at torch.Tensor._make_wrapper_subclass ("Attempted to call function
    marked as skipped")."""
    m = Mesh("w")
    model = unwrap_subclass_parameters(_ScaleDeclared(m))
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    try:
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        outs = [compiled(torch.ones(3)), compiled(torch.full((3,), 2.0))]
    finally:
        torch._dynamo.reset()
    assert [type(o) for o in outs] == [_Declared, _Declared]
    assert all(o._mesh is m and o._tag == "w" for o in outs)
    assert torch.equal(outs[0]._data, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(outs[1]._data, torch.tensor([1.0, 3.0, 5.0]))
    assert counter.frame_count == 1
