"""The compiled forward's check of the opaques it saves for the backward
(fixes/saved_opaques.py): torch's answer on every release, asked of torch's
registry once per registry entry."""

import importlib

import pytest
import torch
import torch._dynamo  # runtime_wrappers imports Dynamo's modules first
from scenarios import frames_started
from subclasses import Mesh

import opaque_subclass as osc
from opaque_subclass import OpaqueBase

runtime_wrappers = importlib.import_module("torch._functorch._aot_autograd.runtime_wrappers")
opaque_object = importlib.import_module("torch._library.opaque_object")
# torch 2.14 renamed the check; the run-time module imports the name of its release
NAME = "is_opaque_type" if hasattr(runtime_wrappers, "is_opaque_type") else "is_custom_class"
TORCHS = getattr(opaque_object, NAME)


def check(cls):
    return getattr(runtime_wrappers, NAME)(cls)


class Unregistered(OpaqueBase):
    pass


class MeshChild(Mesh):
    pass


def test_the_run_time_module_holds_the_librarys_check_and_torchs_public_function_is_unchanged():
    assert getattr(runtime_wrappers, NAME).__name__ == "saved_opaque_class_is_registered"
    assert TORCHS.__module__ == "torch._library.opaque_object"
    osc.disable()
    try:
        assert getattr(runtime_wrappers, NAME) is TORCHS
    finally:
        osc.enable()


@pytest.mark.parametrize("cls", [Mesh, Unregistered, MeshChild, int, "no.such.Class"], ids=repr)
def test_answers_as_torch(cls):
    for _ in range(2):  # the first answer asks torch, the second may come from the memo
        assert check(cls) == TORCHS(cls)


def test_a_known_class_is_answered_without_asking_torch():
    assert check(Mesh) is True
    asked = frames_started(lambda: check(Mesh), NAME, "_resolve_opaque_type_info")
    assert sum(asked.values()) == 0, asked


def test_a_class_registered_after_a_no_is_answered_yes():
    class Late(OpaqueBase):
        pass

    assert check(Late) is False and check(Late) is False
    osc.register_opaque(Late)
    assert check(Late) is True and check(Late) == TORCHS(Late)


@pytest.mark.skipif(not hasattr(opaque_object, "unregister_custom_class"), reason="torch 2.15+ can unregister")
def test_an_unregistered_class_is_asked_again():
    class Gone(OpaqueBase):
        pass

    osc.register_opaque(Gone)
    assert check(Gone) is True and check(Gone) is True
    opaque_object.unregister_custom_class(Gone)
    assert check(Gone) is False and TORCHS(Gone) is False
    osc.register_opaque(Gone)
    assert check(Gone) is True


def test_a_forward_saving_opaques_keeps_their_meshes():
    from subclasses import MeshTensor

    compiled = torch.compile(lambda a, b: (a * b,), backend="aot_eager", fullgraph=True)
    for call in range(2):
        a = MeshTensor(torch.randn(3), Mesh(f"a{call}")).requires_grad_()
        b = MeshTensor(torch.randn(3), a._mesh).requires_grad_()
        (out,) = compiled(a, b)
        ga, gb = torch.autograd.grad(out, (a, b), MeshTensor(torch.ones(3), a._mesh))
        assert ga._mesh is a._mesh and gb._mesh is a._mesh
        assert torch.equal(ga._data, b._data.detach()) and torch.equal(gb._data, a._data.detach())
