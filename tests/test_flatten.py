"""flatten_subclass / unflatten_subclass and the slot walk."""

import pytest
import torch
from subclasses import (
    Interleaved,
    Mesh,
    MeshTensor,
    MultiOpaque,
    PlainPair,
    Stream,
    nested,
)

import opaque_subclass as osc


def test_plain_tensor_is_one_leaf():
    t = torch.randn(3)
    leaves, spec = osc.flatten_subclass(t)
    assert leaves == [t] or leaves[0] is t
    assert spec == osc.TensorSlot(0)
    assert osc.unflatten_subclass(leaves, spec) is t


def test_plain_pair_has_no_opaque():
    x = PlainPair(torch.randn(3), torch.randn(3))
    leaves, spec = osc.flatten_subclass(x)
    assert leaves[0] is x.a and leaves[1] is x.b
    assert (spec.num_tensors, spec.num_opaques, spec.arg_count) == (2, 0, 2)


def test_single_opaque_leaf_is_the_same_object():
    m = Mesh()
    x = MeshTensor(torch.randn(2, 2), m, ctx="c")
    leaves, spec = osc.flatten_subclass(x)
    assert leaves[0] is x._data and leaves[1] is m
    assert spec.attrs["_mesh"] == osc.OpaqueSlot(1, "_mesh", Mesh)
    assert spec.meta == "c" and spec.outer_size == (2, 2) and spec.subclass_type is MeshTensor
    y = osc.unflatten_subclass(leaves, spec)
    assert y._mesh is m and y._data is x._data and y._ctx == "c"


def test_multi_opaque_order_follows_tensor_flatten():
    m, s = Mesh(), Stream(3)
    x = MultiOpaque(torch.randn(2), torch.randn(2), m, s)
    leaves, spec = osc.flatten_subclass(x)
    assert [type(v).__name__ for v in leaves] == ["Tensor", "Tensor", "Mesh", "Stream"]
    assert leaves[2] is m and leaves[3] is s
    assert osc.unflatten_subclass(leaves, spec)._stream is s


def test_interleaved_opaque_takes_its_listed_slot():
    m = Mesh()
    x = Interleaved(torch.randn(2), torch.randn(2), m)
    leaves, spec = osc.flatten_subclass(x)
    assert leaves[1] is m
    assert [(p, s.unwrapped_idx) for p, s in osc.iter_slots(spec, "x")] == [("x._a", 0), ("x._mesh", 1), ("x._b", 2)]


def test_nested_three_levels_paths_and_identity():
    x = nested(3)
    leaves, spec = osc.flatten_subclass(x, name="w")
    meshes = [x._data._data._mesh, x._data._mesh, x._mesh]
    assert leaves[0] is x._data._data._data
    assert leaves[1:] == meshes and all(a is b for a, b in zip(leaves[1:], meshes, strict=True))
    paths = [p for p, _ in osc.iter_slots(spec, "w")]
    assert paths == ["w._data._data._data", "w._data._data._mesh", "w._data._mesh", "w._mesh"]
    assert spec.arg_count == 4 and spec.num_opaques == 3
    inner = spec.attrs["_data"]
    assert isinstance(inner, osc.SubclassLayout) and inner.attr == "_data" and inner.meta == ("lvl", 1)
    y = osc.unflatten_subclass(leaves, spec)
    assert y._data._data._mesh is meshes[0] and y._ctx == ("lvl", 2)


def test_shared_opaque_appears_in_each_slot():
    m = Mesh()
    x = MultiOpaque(torch.randn(2), torch.randn(2), m, Stream())
    y = MeshTensor(x, m)
    leaves, _ = osc.flatten_subclass(y)
    assert leaves[2] is m and leaves[4] is m
    assert osc.opaque_alias_pattern(leaves).shared == ((2, 4),)


def test_unflatten_uses_new_leaves():
    x = nested(2)
    leaves, spec = osc.flatten_subclass(x)
    new_mesh = Mesh("new")
    leaves2 = [torch.zeros_like(leaves[0]), new_mesh, leaves[2]]
    y = osc.unflatten_subclass(leaves2, spec)
    assert y._data._mesh is new_mesh and torch.equal(y._data._data, torch.zeros(2, 3))


def test_spec_method():
    x = MeshTensor(torch.randn(3), Mesh())
    leaves, spec = osc.flatten_subclass(x)
    assert spec.unflatten(leaves)._mesh is leaves[1]


def test_spec_is_frozen():
    _, spec = osc.flatten_subclass(MeshTensor(torch.randn(3), Mesh()))
    with pytest.raises(AttributeError):
        spec.meta = "other"
    with pytest.raises(TypeError, match="read-only"):
        spec.attrs["_x"] = spec.attrs["_mesh"]


def test_meta_validates_slot_layout():
    with pytest.raises(ValueError, match="contiguous"):
        osc.SubclassLayout(
            flat_tensor_start_idx=0,
            attrs={"_data": osc.TensorSlot(0, "_data"), "_mesh": osc.OpaqueSlot(2, "_mesh", Mesh)},
            meta=None,
            outer_size=(1,),
            outer_stride=(1,),
            subclass_type=MeshTensor,
        )
    with pytest.raises(ValueError, match="must agree"):
        osc.SubclassLayout(0, {"_data": osc.TensorSlot(0, "other")}, None, (1,), (1,), MeshTensor)
