"""torch.export of modules with opaque-attribute subclass parameters and inputs."""

import re

import pytest
import torch
from subclasses import HoldsMesh, Mesh, MeshTensor

from opaque_subclass import (
    OpaqueSubclass,
    OpaqueSubclassError,
    is_exportable_constructor,
    unwrap_subclass_parameters,
)


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


STRICT = pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])


@STRICT
def test_export_after_unwrap_has_only_plain_tensor_parameters(strict):
    mesh = Mesh("u")
    module = Scale(mesh)
    unwrap_subclass_parameters(module)
    x = torch.randn(3)
    ep = torch.export.export(module, (x,), strict=strict)
    assert {k: type(v) for k, v in ep.state_dict.items()} == {"parametrizations.w.original0": torch.nn.Parameter}
    kinds = [(spec.kind.name, spec.target) for spec in ep.graph_signature.input_specs]
    assert kinds == [
        ("PARAMETER", "parametrizations.w.original0"),
        ("CUSTOM_OBJ", "parametrizations.w.0.lifted_custom_0"),
        ("USER_INPUT", None),
    ]
    assert ep.constants["parametrizations.w.0.lifted_custom_0"] is mesh
    out, ref = ep.module()(x), module(x)
    assert type(out) is Sharded and out._mesh is mesh
    torch.testing.assert_close(out._data, ref._data)


class MaybeSharded(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_dim",)


@STRICT
def test_export_after_unwrap_with_none_metadata(strict):
    """torch.export records the constructor call, whose arguments must be FX
    graphable; None is not (torch: 'found non-fx-graphable type NoneType')."""
    mesh = Mesh("n")
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(MaybeSharded(torch.arange(3.0), mesh, None))
    module.forward = lambda x: module.w * x
    unwrap_subclass_parameters(module)
    x = torch.randn(3)
    ep = torch.export.export(module, (x,), strict=strict)
    out = ep.module()(x)
    assert type(out) is MaybeSharded and out._mesh is mesh and out._dim is None
    torch.testing.assert_close(out._data, torch.arange(3.0) * x)


class SharedMesh(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        self.w = torch.nn.Parameter(Sharded(torch.arange(3.0), mesh))
        self.v = torch.nn.Parameter(Sharded(torch.ones(3), mesh))

    def forward(self, x):
        return self.w * x, self.v + x


@STRICT
def test_export_after_unwrap_lifts_a_shared_opaque_once(strict):
    mesh = Mesh("shared")
    module = unwrap_subclass_parameters(SharedMesh(mesh))
    ep = torch.export.export(module, (torch.ones(3),), strict=strict)
    custom = [spec.target for spec in ep.graph_signature.input_specs if spec.kind.name == "CUSTOM_OBJ"]
    assert len(custom) == 1 and ep.constants[custom[0]] is mesh
    w, v = ep.module()(torch.full((3,), 2.0))
    assert w._mesh is mesh and v._mesh is mesh
    torch.testing.assert_close(w._data, torch.arange(3.0) * 2)
    torch.testing.assert_close(v._data, torch.full((3,), 3.0))


@STRICT
def test_export_of_an_opaque_module_attribute(strict):
    mesh = Mesh("abcd")
    ep = torch.export.export(HoldsMesh(mesh), (torch.ones(2),), strict=strict)
    assert [(spec.kind.name, spec.target) for spec in ep.graph_signature.input_specs] == [
        ("CUSTOM_OBJ", "lifted_custom_0"),
        ("USER_INPUT", None),
    ]
    unlifted = ep.module()
    assert unlifted.lifted_custom_0 is mesh
    torch.testing.assert_close(unlifted(torch.ones(2)), torch.full((2,), 5.0))


class Layer(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.w = torch.nn.Parameter(weight)

    def forward(self, x):
        return self.w * x


class Net(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.layer = Layer(weight)

    def forward(self, x):
        return self.layer(x)


def test_exportable_constructor_detection():
    from torch._export.wrappers import mark_subclass_constructor_exportable_experimental

    class Marked(MeshTensor):
        pass

    Marked.__init__ = torch._disable_dynamo(mark_subclass_constructor_exportable_experimental(MeshTensor.__init__))
    assert is_exportable_constructor(Sharded) and is_exportable_constructor(Marked)
    assert not is_exportable_constructor(MeshTensor) and not is_exportable_constructor(torch.Tensor)


@STRICT
def test_export_of_unrecordable_rebuild_names_subclass_path_and_fix(strict):
    mesh = Mesh("hand")
    module = unwrap_subclass_parameters(Net(MeshTensor(torch.arange(3.0), mesh)))
    x = torch.ones(3)
    assert type(module(x)) is MeshTensor  # eager (and compile) are unaffected
    with pytest.raises(Exception) as info:
        torch.export.export(module, (x,), strict=strict)
    msg = str(info.value)
    # Non-strict raises ours; strict mode's Dynamo wraps it (Unsupported: Observed exception).
    assert isinstance(info.value, OpaqueSubclassError) or "Observed exception" in msg
    assert "'layer.w'" in msg and "subclasses.MeshTensor at 'layer.w'" in msg
    assert (
        "Unable to cast NotImplemented to Tensor" in msg and "mark_subclass_constructor_exportable_experimental" in msg
    )
    fix = re.search(r"Fix: [^`]*`([^`]+)`", msg).group(1)
    assert fix == "torch.nn.utils.parametrize.remove_parametrizations(module.layer, 'w')"
    exec(fix, {"torch": torch, "module": module})  # the fix runs as written
    ep = torch.export.export(module, (x,), strict=strict)
    out = ep.module()(x)
    assert type(out) is MeshTensor and out._mesh is mesh
    torch.testing.assert_close(out._data, torch.arange(3.0))


def test_unrecordable_nested_level_is_named():
    from opaque_subclass.modules.parametrization import UnwrapSubclass

    class Outer(OpaqueSubclass):
        tensor_attrs = ("_inner",)

    p = UnwrapSubclass("blocks.0.w")
    p.right_inverse(Outer(MeshTensor(torch.ones(2), Mesh("n"))))
    assert "subclasses.MeshTensor at 'blocks.0.w._inner'" in p._export_error
    assert "Outer" not in p._export_error  # the outer level is recordable
    assert "remove_parametrizations(module.get_submodule('blocks.0'), 'w')" in p._export_error
