"""opaque_alias_pattern: identity sharing of opaques across flat slots."""

import torch
from subclasses import Config, Mesh, MeshTensor
from torch._library.fake_class_registry import FakeScriptObject

import opaque_subclass as osc


def _flat(*args):
    return osc.unwrap_args(list(args), is_joint_structure=False)


def test_no_opaques():
    p = osc.opaque_alias_pattern([torch.ones(1), 3, None])
    assert p.slots == () and p.groups == () and not p.has_sharing


def test_shared_and_distinct():
    a, b = Mesh("a"), Mesh("b")
    flat = _flat(MeshTensor(torch.ones(1), a), MeshTensor(torch.ones(1), a), MeshTensor(torch.ones(1), b), a)
    p = osc.opaque_alias_pattern(flat)
    assert p.slots == (1, 3, 5, 6) and p.owners == (1, 1, 5, 1)
    assert p.groups == ((1, 3, 6), (5,)) and p.shared == ((1, 3, 6),) and p.has_sharing


def test_equality_is_by_identity_pattern_not_objects():
    a, b, c, d = (Mesh(n) for n in "abcd")
    shared = osc.opaque_alias_pattern(_flat(MeshTensor(torch.ones(1), a), MeshTensor(torch.ones(1), a)))
    shared_other = osc.opaque_alias_pattern(_flat(MeshTensor(torch.ones(1), c), MeshTensor(torch.ones(1), c)))
    split = osc.opaque_alias_pattern(_flat(MeshTensor(torch.ones(1), c), MeshTensor(torch.ones(1), d)))
    assert shared == shared_other and hash(shared) == hash(shared_other)
    assert shared != split
    assert len({shared, shared_other, split}) == 2
    del b


def test_value_opaques_and_equal_objects_do_not_share():
    class EqMesh(Mesh):
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    p = osc.opaque_alias_pattern([EqMesh(), EqMesh(), Config(1), Config(1)])
    assert p.slots == (0, 1) and not p.has_sharing


def test_fake_wrappers_are_seen_through():
    m = Mesh()
    fake1 = FakeScriptObject(m, "m", None)
    object.__setattr__(fake1, "real_obj", m)
    fake2 = FakeScriptObject(m, "m", None)
    object.__setattr__(fake2, "real_obj", m)
    p = osc.opaque_alias_pattern([fake1, fake2, Mesh()])
    assert p.shared == ((0, 1),) and p.slots == (0, 1, 2)
