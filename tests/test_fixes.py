"""Native-mode fixes: each fix of the running release's fix set (the version
table's ``fixes`` module) is listed, documented, and needed: its scenario
passes with the fix and fails with torch's own error when only that fix is
suspended. On a release without fixes every test here is skipped."""

from __future__ import annotations

import importlib

import pytest
import torch
from subclasses import ForeignHandle, ForeignTensor, Mesh, MeshTensor, save_and_load_opaque_constant

import opaque_subclass as osc
from opaque_subclass._versions import current

ROW = current()
FIX_SET = importlib.import_module(ROW.fixes).FIX_SET if ROW.fixes else None
needs_fixes = pytest.mark.skipif(FIX_SET is None, reason=f"no native fixes for torch {ROW.label}")


def _compile_foreign_class_attribute():
    """A class registered without inheriting OpaqueBase, as an attribute, through
    compile, backward: the output and gradient carry the call's own object."""
    f = torch.compile(lambda x: (x * 2).sum(), backend="aot_eager", fullgraph=True)
    handle = ForeignHandle("fix")
    x = ForeignTensor(torch.ones(3), handle).requires_grad_(True)
    f(x).backward()
    assert x.grad._handle is handle


def _export_module_with_opaque_constant():
    """``ExportedProgram.module()`` of a program whose lifted constant is an opaque."""

    class Scale(torch.nn.Module):
        def __init__(self, mesh):
            super().__init__()
            self.w = torch.nn.Parameter(_Lifted(torch.arange(3.0), mesh))

        def forward(self, x):
            return self.w * x

    mesh = Mesh("fix-export")
    module = osc.unwrap_tensor_subclass_parameters(Scale(mesh))
    ep = torch.export.export(module, (torch.ones(3),), strict=False)
    assert ep.module()(torch.ones(3))._mesh is mesh


def _backward_logs_no_deprecation():
    """A compiled backward whose graph holds an opaque logs none of torch's
    deprecation warnings about opaque-object names."""
    import logging

    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(level=logging.WARNING)
    logger = logging.getLogger("torch._library.opaque_object")
    logger.addHandler(handler)
    try:
        f = torch.compile(lambda x: (x * x).sum(), backend="aot_eager", fullgraph=True)
        mesh = Mesh("no-deprecation")
        x = MeshTensor(torch.ones(3), mesh).requires_grad_(True)
        f(x).backward()
    finally:
        logger.removeHandler(handler)
    assert x.grad._mesh is mesh
    logged = [r.getMessage() for r in records if "deprecated" in r.getMessage()]
    assert not logged, f"torch logged: {logged}"


def _inductor_cache_keeps_sharing_apart():
    """With torch's caches on (a fresh cache directory), a call with distinct
    meshes after one with a shared mesh gets its own meshes back."""
    import os
    import shutil
    import tempfile

    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    fresh = tempfile.mkdtemp(prefix="opaque-subclass-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh
    try:
        f = torch.compile(lambda x, y: (x + y, y * 2), backend="inductor", fullgraph=True)
        m = Mesh("shared")
        f(MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), m))
        a, b = Mesh("a"), Mesh("b")
        o1, o2 = f(MeshTensor(torch.ones(2), a), MeshTensor(torch.ones(2), b))
        assert o1._mesh is a and o2._mesh is b, (
            f"outputs carry {o1._mesh} and {o2._mesh}, expected Mesh('a') and Mesh('b')"
        )
    finally:
        if previous is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
        shutil.rmtree(fresh, ignore_errors=True)


class _Lifted(osc.OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


def _bad_attribute():
    x = MeshTensor(torch.ones(2), Mesh("bad"))
    x._mesh = 3  # an int where an opaque is listed
    return x


def _compile_names_a_bad_attribute():
    """torch.compile of a subclass argument listing an int: the library's error."""
    f = torch.compile(lambda x: x + 1, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception) as info:
        f(_bad_attribute())
    msg = str(info.value)
    assert "MeshTensor.__tensor_flatten__()" in msg and "L['x']._mesh" in msg, msg
    assert "holds int" in msg and "Fix:" in msg, msg


def _export_names_a_bad_attribute():
    """Non-strict export of a subclass input listing an int: the library's error."""

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(Exception) as info:
        torch.export.export(Double(), (_bad_attribute(),), strict=False)
    msg = str(info.value)
    assert "MeshTensor.__tensor_flatten__()" in msg and "L['x']._mesh" in msg, msg
    assert "holds int" in msg and "Fix:" in msg, msg


#: target -> (scenario, the stock torch error it fails with when the fix is off;
#: for a wrong result, the scenario's own assertion naming it)
NEEDED_BY = {
    "torch.export.pt2_archive._package._package_constants": (
        save_and_load_opaque_constant,
        "Unsupported constant type",
    ),
    "torch.export.pt2_archive._package._load_constants": (
        save_and_load_opaque_constant,
        "We ran into an error when deserializing the saved file",  # torch's wrapper of "Unsupported constant type: opaque_obj_0"
    ),
    "torch._opaque_base.OpaqueBaseMeta.__instancecheck__": (
        _compile_foreign_class_attribute,
        "expected Tensor or OpaqueBase, got <class 'subclasses.ForeignHandle'>",
    ),
    "torch.export.unflatten._assign_attr": (
        _export_module_with_opaque_constant,
        "expected torch.Tensor or torch.ScriptObject for CONSTANT attr_kind",
    ),
    "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key": (
        _inductor_cache_keeps_sharing_apart,
        "expected Mesh('a') and Mesh('b')",
    ),
    "torch._functorch.partitioners.is_opaque_value": (
        _backward_logs_no_deprecation,
        "is_opaque_value is deprecated, use is_custom_class_obj instead",
    ),
    "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor": (
        _compile_names_a_bad_attribute,
        "expected Tensor or ",
    ),
    "torch._export.non_strict_utils._create_symbolic_context_for_tensor": (
        _export_names_a_bad_attribute,
        "expected Tensor or ",
    ),
}


@needs_fixes
def test_support_lists_every_fix():
    assert osc.support().mode == "native" and osc.support().patched == ()
    assert osc.support().fixes == tuple(p.target for p in FIX_SET.patches)


@needs_fixes
def test_every_fix_has_a_scenario():
    assert {p.target for p in FIX_SET.patches} <= set(NEEDED_BY)


@needs_fixes
def test_every_fix_documents_what_it_replaces():
    for p in FIX_SET.patches:
        doc = " ".join(p.doc.split())
        assert f"``{p.target}``" in doc, p.target
        assert "Replaces" in doc and "torch " in doc and ROW.label in doc, p.target
        assert "Without it" in doc and "With it" in doc, p.target


@needs_fixes
@pytest.mark.parametrize("target", [p.target for p in FIX_SET.patches] if FIX_SET else [])
def test_fix_is_needed(target):
    scenario, stock_error = NEEDED_BY[target]
    torch._dynamo.reset()
    scenario()
    torch._dynamo.reset()
    with FIX_SET.suspended(target):
        with pytest.raises(Exception) as info:  # torch's own failure, checked by its message below
            scenario()
    assert stock_error in str(info.value), str(info.value)
    torch._dynamo.reset()
