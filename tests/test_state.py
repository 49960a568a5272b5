"""State the library keeps is its own (#24): after compilations with opaques
(forward and backward, a cache round trip), no object of torch's carries an
attribute of the library's, and the patches share no module-level state."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

import torch
from subclasses import Mesh, MeshTensor

ROOT = Path(__file__).resolve().parents[1]


def _library_attributes_on_torch_objects() -> list[str]:
    found = []
    for obj in gc.get_objects():
        module = getattr(type(obj), "__module__", None)
        if not isinstance(module, str) or not module.startswith("torch"):
            continue
        try:
            names = vars(obj)
        except TypeError:
            continue
        found += [f"{type(obj).__qualname__}.{k}" for k in list(names) if str(k).startswith("_opaque_subclass")]
    return found


def test_no_library_state_is_left_on_torch_objects():
    torch._dynamo.reset()
    x = MeshTensor(torch.ones(3), Mesh()).requires_grad_(True)
    f = torch.compile(lambda t: (t * 2).sin(), backend="aot_eager", fullgraph=True)
    f(x).sum().backward()
    g = torch.compile(lambda t, u: t + u, backend="inductor", fullgraph=True)
    g(MeshTensor(torch.ones(3), Mesh()), MeshTensor(torch.ones(3), Mesh()))
    assert _library_attributes_on_torch_objects() == []


def test_the_state_check_can_fail():
    class Holder:  # stands in for one of torch's objects
        pass

    Holder.__module__ = "torch.fake_module_for_the_test"
    holder = Holder()
    holder._opaque_subclass_first_proxy = {}
    assert any(f.endswith("Holder._opaque_subclass_first_proxy") for f in _library_attributes_on_torch_objects())
    del holder


def _module_level_thread_locals(path: Path) -> list[str]:
    """Module-level names bound to ``threading.local()`` (or a subclass made
    here) in one patch module: state that replacements would share."""
    tree = ast.parse(path.read_text())
    local_classes = {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("local") for b in node.bases)
    }
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            called = ast.unparse(node.value.func)
            if called.endswith("threading.local") or called in local_classes:
                found += [ast.unparse(t) for t in node.targets]
    return found


def test_patch_modules_keep_no_module_level_state():
    """The replacements of ``backport/`` and ``fixes/`` keep what they remember
    in their own closures (made when the set is enabled, dropped with it), never
    in module globals passed between patches."""
    found = {
        str(p.relative_to(ROOT)): names
        for package in ("backport", "fixes")
        for p in sorted((ROOT / "opaque_subclass" / package).glob("*.py"))
        if (names := _module_level_thread_locals(p))
    }
    assert found == {}


def test_the_module_state_check_can_fail(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import threading\n_SHARED = threading.local()\n")
    assert _module_level_thread_locals(module) == ["_SHARED"]
