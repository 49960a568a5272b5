"""register_opaque / is_opaque / opaque_kind on every supported torch."""

import enum

import pytest
import torch
from torch._library import opaque_object
from torch._opaque_base import OpaqueBase

import opaque_subclass as osc
from subclasses import Config, ForeignHandle, Mesh


def test_registered_kinds():
    assert osc.opaque_kind(Mesh()) == "reference" and osc.is_opaque(Mesh)
    assert osc.opaque_kind(Config(1)) == "value"
    assert osc.opaque_kind(ForeignHandle()) == "reference"
    assert osc.opaque_kind(torch.ones(1)) is None and not osc.is_opaque(3)


def test_torch_sees_our_registrations():
    assert opaque_object.is_opaque_reference_type(Mesh)
    assert opaque_object.is_opaque_reference_type(ForeignHandle)
    assert opaque_object.is_opaque_value_type(Config)


def test_subclass_of_registered_class_is_opaque():
    class SubMesh(Mesh):
        pass

    assert osc.opaque_kind(SubMesh()) == "reference"


def test_register_twice_same_kind_is_noop():
    class Once(OpaqueBase):
        pass

    osc.register_opaque(Once)
    osc.register_opaque(Once)
    assert osc.opaque_kind(Once) == "reference"


def test_register_other_kind_is_refused():
    with pytest.raises(ValueError, match='already registered as a reference opaque.*register_opaque\\(Mesh, kind="reference"\\)'):
        osc.register_opaque(Mesh, kind="value")


def test_class_not_inheriting_opaque_base():
    class Handle:
        pass

    osc.register_opaque(Handle)
    assert osc.opaque_kind(Handle()) == "reference"
    assert torch._C._is_opaque_type_registered(f"{Handle.__module__}.{Handle.__qualname__}")


def test_tolerates_registration_made_by_torch():
    class TorchFirst(OpaqueBase):
        pass

    opaque_object.register_opaque_type(TorchFirst, typ="reference")
    osc.register_opaque(TorchFirst)  # no error
    with pytest.raises(ValueError, match="already registered"):
        osc.register_opaque(TorchFirst, kind="value")


@pytest.mark.parametrize(
    "bad, exc, pattern",
    [
        (int, TypeError, "builtins and tensors"),
        (torch.Tensor, TypeError, "builtins and tensors"),
        (Mesh(), TypeError, "expects a class, got an instance of Mesh"),
    ],
)
def test_bad_classes(bad, exc, pattern):
    with pytest.raises(exc, match=pattern):
        osc.register_opaque(bad)


def test_bad_kind():
    class K(OpaqueBase):
        pass

    with pytest.raises(ValueError, match='kind must be "reference" or "value"'):
        osc.register_opaque(K, kind="ref")


def test_value_type_protocol_is_checked_with_fix():
    class NoEq(OpaqueBase):
        pass

    with pytest.raises(TypeError) as info:
        osc.register_opaque(NoEq, kind="value")
    msg = str(info.value)
    assert "test_registry" in msg and "NoEq" in msg and "__eq__" in msg and "__fx_repr__" in msg
    assert 'register_opaque(NoEq, kind="reference")' in msg


def test_enum_value_type():
    class Color(enum.Enum):
        RED = 1

    osc.register_opaque(Color, kind="value")
    assert osc.opaque_kind(Color.RED) == "value"


def test_pytree_node_refused():
    from torch.utils import _pytree as pytree

    class Node:
        pass

    pytree.register_pytree_node(Node, lambda n: ([], None), lambda c, x: Node())
    with pytest.raises(TypeError, match="pytree node"):
        osc.register_opaque(Node)
