"""The reusable contract (opaque_subclass.testing) run against every test subclass."""

import pytest
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
    _Wrapper,
    nested,
)
from torch.utils._pytree import tree_leaves, tree_map_only

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


# ------------------------------------------------------------------------ the contract's checks can fail
#
# Each fixed check, run against a subclass broken on purpose, fails with its
# message; before the fix it passed vacuously (``all(zip(...))`` of lists of
# different lengths, or a pattern compared with itself). The contract classes
# below are not collected (their names do not start with "Test").


class DropsStream(_Wrapper):
    """Broken on purpose: its ops' outputs (so also gradients) and its
    ``__tensor_unflatten__`` keep the mesh and drop the stream, and its
    ``__tensor_flatten__`` lists only the opaques an instance holds."""

    INNER = ("_data",)
    OPAQUES = ("_mesh", "_stream")

    def __tensor_flatten__(self):
        return ["_data", "_mesh", *(["_stream"] if self._stream is not None else [])], self._ctx

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, size, stride):
        return cls(inner["_data"], inner["_mesh"], None, ctx=ctx)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        proto = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, cls))
        out = func(*tree_map_only(cls, lambda t: t._data, args), **tree_map_only(cls, lambda t: t._data, kwargs or {}))
        return tree_map_only(torch.Tensor, lambda t: cls(t, proto._mesh, None, ctx=proto._ctx), out)


class FreshMeshEachRead(_Wrapper):
    """Broken on purpose: ``_mesh`` is a property that builds a new Mesh on
    every read, so flattening one instance twice gives two different objects."""

    INNER = ("_data",)
    OPAQUES = ("_name",)

    def __tensor_flatten__(self):
        return ["_data", "_mesh"], self._ctx

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, size, stride):
        return cls(inner["_data"], inner["_mesh"].name, ctx=ctx)

    @property
    def _mesh(self):
        return Mesh(self._name)


class DropsStreamContract(OpaqueSubclassContract):
    SUBCLASS = DropsStream
    FACTORY = staticmethod(lambda: DropsStream(torch.randn(3), Mesh("kept"), Stream(7)))


class FreshMeshContract(OpaqueSubclassContract):
    SUBCLASS = FreshMeshEachRead
    FACTORY = staticmethod(lambda: FreshMeshEachRead(torch.randn(3), "fresh"))


#: check of the contract -> what it says about DropsStream
_DROPPED = r": 1 opaque\(s\) \[Mesh\('kept'\)\], expected 2 \[Mesh\('kept'\), Stream\(7\)\]"


@pytest.mark.parametrize(
    "check, message",
    [
        ("test_compile_backward", r"^x\.grad does not carry x's opaques" + _DROPPED),
        ("test_compiled_autograd", r"^x\.grad \(compiled autograd\) does not carry x's opaques" + _DROPPED),
        ("test_parametrization_keeps_opaques", r"^module\.p does not hold the original opaques" + _DROPPED),
    ],
)
def test_opaque_checks_fail_when_an_opaque_is_dropped(check, message):
    """x.grad / the rebuilt parameter hold the mesh but not the stream: the
    opaques compared pairwise agree, the counts do not."""
    with pytest.raises(AssertionError, match=message):
        getattr(DropsStreamContract(), check)()


def test_alias_pattern_check_fails_when_flattening_reads_new_objects():
    """Flattening the same instance twice gives two meshes: the pattern of
    ``[a, a]`` shows no sharing, which the check now compares with the sharing
    the pattern must show."""
    contract = FreshMeshContract()
    with pytest.raises(AssertionError, match=r"its second copy does not share the first's opaques"):
        contract.test_alias_pattern_tracks_identity()
