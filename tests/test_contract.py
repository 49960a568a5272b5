"""The reusable contract (opaque_subclass.testing) run against every test subclass."""

import torch

from opaque_subclass.testing import OpaqueSubclassContract
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

SHARED = Mesh("shared")


class TestPlainPair(OpaqueSubclassContract):
    factory = staticmethod(lambda: PlainPair(torch.randn(3), torch.randn(3)))


class TestMeshTensor(OpaqueSubclassContract):
    factory = staticmethod(lambda: MeshTensor(torch.randn(2, 3), Mesh()))


class TestMeshTensorSharedMesh(OpaqueSubclassContract):
    factory = staticmethod(lambda: MeshTensor(torch.randn(4), SHARED))


class TestMultiOpaque(OpaqueSubclassContract):
    factory = staticmethod(lambda: MultiOpaque(torch.randn(3), torch.randn(3), Mesh(), Stream(1)))


class TestInterleaved(OpaqueSubclassContract):
    factory = staticmethod(lambda: Interleaved(torch.randn(3), torch.randn(3), Mesh()))


class TestForeignOpaque(OpaqueSubclassContract):
    factory = staticmethod(lambda: ForeignTensor(torch.randn(3), ForeignHandle()))


class TestNestedThreeLevels(OpaqueSubclassContract):
    factory = staticmethod(lambda: nested(3))


class TestNonContiguousOuter(OpaqueSubclassContract):
    factory = staticmethod(lambda: MeshTensor(torch.randn(3, 4).t(), Mesh()))
