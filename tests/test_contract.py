"""The reusable contract (opaque_subclass.testing) run against every test subclass."""

import torch
from subclasses import (
    ForeignHandle,
    ForeignTensor,
    Interleaved,
    Mesh,
    MeshTensor,
    MultiOpaque,
    PlainPair,
    Stream,
    nested,
)

from opaque_subclass import OpaqueSubclass
from opaque_subclass.testing import OpaqueSubclassContract

SHARED = Mesh("shared")


class Declared(OpaqueSubclass):
    """The declarative base class under the same contract as hand-written subclasses."""

    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh, "_stream": Stream}
    meta_attrs = ("_tag",)


class TestPlainPair(OpaqueSubclassContract):
    SUBCLASS = PlainPair
    FACTORY = staticmethod(lambda: PlainPair(torch.randn(3), torch.randn(3)))


class TestMeshTensor(OpaqueSubclassContract):
    SUBCLASS = MeshTensor
    FACTORY = staticmethod(lambda: MeshTensor(torch.randn(2, 3), Mesh()))


class TestMeshTensorSharedMesh(OpaqueSubclassContract):
    SUBCLASS = MeshTensor
    FACTORY = staticmethod(lambda: MeshTensor(torch.randn(4), SHARED))


class TestMultiOpaque(OpaqueSubclassContract):
    SUBCLASS = MultiOpaque
    FACTORY = staticmethod(lambda: MultiOpaque(torch.randn(3), torch.randn(3), Mesh(), Stream(1)))


class TestInterleaved(OpaqueSubclassContract):
    SUBCLASS = Interleaved
    FACTORY = staticmethod(lambda: Interleaved(torch.randn(3), torch.randn(3), Mesh()))


class TestForeignOpaque(OpaqueSubclassContract):
    SUBCLASS = ForeignTensor
    FACTORY = staticmethod(lambda: ForeignTensor(torch.randn(3), ForeignHandle()))


class TestNestedThreeLevels(OpaqueSubclassContract):
    SUBCLASS = MeshTensor
    FACTORY = staticmethod(lambda: nested(3))


class TestNonContiguousOuter(OpaqueSubclassContract):
    SUBCLASS = MeshTensor
    FACTORY = staticmethod(lambda: MeshTensor(torch.randn(3, 4).t(), Mesh()))


class TestDeclarative(OpaqueSubclassContract):
    SUBCLASS = Declared
    FACTORY = staticmethod(lambda: Declared(torch.randn(3), Mesh(), Stream(2), "cfg"))
