"""torch.export of modules with opaque-attribute subclass parameters and inputs."""

import pytest
import torch

import opaque_subclass as osc
from opaque_subclass import OpaqueSubclass, unwrap_tensor_subclass_parameters
from subclasses import Mesh

BACKPORT = osc.support().mode == "backport"


class Sharded(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


class Scale(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        self.w = torch.nn.Parameter(Sharded(torch.arange(3.0), mesh))

    def forward(self, x):
        return self.w * x + 1


class Affine(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_subclass_parameter_matches_eager(strict):
    mesh = Mesh("p")
    module = Scale(mesh)
    x = torch.randn(3)
    ep = torch.export.export(module, (x,), strict=strict)
    out, ref = ep.module()(x), module(x)
    assert type(out) is Sharded and out._mesh is mesh
    torch.testing.assert_close(out._data, ref._data)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_subclass_input_uses_runtime_opaque(strict):
    ep = torch.export.export(Affine(), (Sharded(torch.ones(3), Mesh("trace")),), strict=strict)
    runtime = Sharded(torch.arange(3.0), Mesh("run"))
    out = ep.module()(runtime)
    assert type(out) is Sharded and out._mesh is runtime._mesh
    torch.testing.assert_close(out._data, torch.arange(3.0) * 2 + 1)


@pytest.mark.parametrize(
    "strict",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.xfail(
                BACKPORT,
                reason="torch 2.11 strict export: Dynamo makes the opaque module attribute a graph input "
                "with an attribute source, and export's capture asserts user-input sources (not backported yet)",
                raises=AssertionError,
                strict=True,
            ),
        ),
    ],
    ids=["non-strict", "strict"],
)
def test_export_after_unwrap_has_only_plain_tensor_parameters(strict):
    mesh = Mesh("u")
    module = Scale(mesh)
    unwrap_tensor_subclass_parameters(module)
    x = torch.randn(3)
    ep = torch.export.export(module, (x,), strict=strict)
    assert {k: type(v) for k, v in ep.state_dict.items()} == {"parametrizations.w.original0": torch.nn.Parameter}
    out, ref = ep.module()(x), module(x)
    assert type(out) is Sharded and out._mesh is mesh
    torch.testing.assert_close(out._data, ref._data)
