"""``OpaqueSubclass`` declarations take ``register_opaque``'s options
(``opaque_attrs = {"_g": OpaqueAttr(Cls, members=...)}``): the class is
registered with them, compiled code may use the declared members (guarded), and
options that disagree with an earlier registration are a named error."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import opaque_subclass as osc
from opaque_subclass import Member, OpaqueAttr, OpaqueBase, OpaqueSubclass


def _fresh_class(name: str) -> type:
    """A new opaque class with a ``scale()`` method (each test its own, since
    registrations last for the process)."""

    def __init__(self, scale):
        self._scale = scale

    def scale(self):
        return self._scale

    return type(name, (OpaqueBase,), {"__init__": __init__, "scale": scale, "__module__": __name__})


def _compiled_scales(tensor_cls, holder_cls, scales):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    try:
        compiled = torch.compile(lambda t: t._data * t._h.scale(), backend=counter, fullgraph=True)
        outs = [compiled(tensor_cls(torch.ones(1), holder_cls(s))).item() for s in scales]
    finally:
        torch._dynamo.reset()
    return outs, counter.frame_count


def test_declaration_registers_with_members_and_compiled_code_uses_them():
    Holder = _fresh_class("HolderA")
    assert osc.opaque_kind(Holder) is None

    class Scaled(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_h": OpaqueAttr(Holder, members={"scale": Member.USE_REAL})}

    assert osc.opaque_kind(Holder) == "reference"
    assert Scaled.opaque_attrs == {"_h": Holder}  # entries read as their classes
    outs, compilations = _compiled_scales(Scaled, Holder, [2, 2, 3])
    assert outs == [2.0, 2.0, 3.0]
    assert compilations == 2  # the baked scale() is guarded


def test_same_options_as_an_earlier_registration_are_accepted():
    Holder = _fresh_class("HolderB")
    osc.register_opaque(Holder, members={"scale": "use_real"})

    class Scaled(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_h": OpaqueAttr(Holder, members={"scale": Member.USE_REAL})}

    assert _compiled_scales(Scaled, Holder, [4]) == ([4.0], 1)


def test_options_that_disagree_with_the_registration_are_named():
    Holder = _fresh_class("HolderC")
    osc.register_opaque(Holder)  # no members

    with pytest.raises(ValueError) as info:

        class Scaled(OpaqueSubclass):
            tensor_attrs = ("_data",)
            opaque_attrs = {"_h": OpaqueAttr(Holder, members={"scale": Member.USE_REAL})}

    message = str(info.value)
    assert "Scaled" in message and "opaque_attrs['_h']" in message and "HolderC" in message
    assert "Fix" in message


def test_bad_options_are_named_with_the_declaration():
    Holder = _fresh_class("HolderD")
    with pytest.raises(TypeError) as info:

        class Scaled(OpaqueSubclass):
            tensor_attrs = ("_data",)
            opaque_attrs = {"_h": OpaqueAttr(Holder, members={"scale": "sometimes"})}

    message = str(info.value)
    assert "Scaled" in message and "opaque_attrs['_h']" in message and "sometimes" in message
    assert osc.opaque_kind(Holder) is None  # nothing registered


def test_hoist_on_a_reference_opaque_is_refused_as_register_opaque_refuses_it():
    Holder = _fresh_class("HolderE")
    with pytest.raises(ValueError, match="hoist"):

        class Scaled(OpaqueSubclass):
            tensor_attrs = ("_data",)
            opaque_attrs = {"_h": OpaqueAttr(Holder, hoist=True)}


def test_register_opaques_true_registers_with_the_options_at_the_first_instance():
    Holder = _fresh_class("HolderF")

    class Scaled(OpaqueSubclass, register_opaques=True):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_h": OpaqueAttr(Holder, members={"scale": Member.USE_REAL})}

    assert osc.opaque_kind(Holder) is None  # nothing registered by the class statement
    Scaled(torch.ones(1), Holder(1))
    assert osc.opaque_kind(Holder) == "reference"
    outs, compilations = _compiled_scales(Scaled, Holder, [5, 6])
    assert outs == [5.0, 6.0] and compilations == 2


def test_without_options_an_undeclared_member_stays_a_named_error():
    Holder = _fresh_class("HolderG")
    osc.register_opaque(Holder)

    class Scaled(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_h": Holder}

    with pytest.raises(Exception, match=r"members=") as info:
        _compiled_scales(Scaled, Holder, [1])
    assert "scale" in str(info.value)
