"""The examples of the docs and the README run and print what the docs say.

Runs ``docs/check_examples.py --in-process PAGE`` (every ``python`` block of
``docs/*.md`` and of ``README.md``, each file in a fresh interpreter) on the
running torch.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import subclasses
import torch

import opaque_subclass as osc
from opaque_subclass.testing import warm

ROOT = Path(__file__).resolve().parent.parent


#: Every page whose examples docs/check_examples.py runs by default: one test each, so that a
#: parallel run (pytest -n) spreads the pages over its workers.
# (errors_source.md is the source of errors.md: its fences are triggers that raise)
PAGES = [*sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "errors_source.md"), ROOT / "README.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_examples_run(page: Path) -> None:
    proc = warm.run(
        # --in-process: the page runs in this fresh interpreter itself, not in one that the
        # runner would start for it (one interpreter and one torch import per page, not two);
        # forked by the session's WarmInterpreters (tests/conftest.py)
        [sys.executable, str(ROOT / "docs" / "check_examples.py"), "--in-process", str(page)],
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"docs/check_examples.py {page.name} exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr[-20000:]}"
    )
    assert re.search(rf"^{re.escape(page.name)}: (\d+) of \1 blocks passed$", proc.stdout, re.MULTILINE), proc.stdout


def test_compatibility_page_matches_the_version_table():
    proc = warm.run([sys.executable, str(ROOT / "docs" / "gen_compatibility.py"), "--check"], cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ the docs' Mesh/MeshTensor match the fixtures
#
# The README and the guide define their own small Mesh and MeshTensor so that
# each example runs on its own. Their class statements (with the imports and
# the registration of Mesh from the same code block) are run here and compared
# with the test suite's fixtures (tests/subclasses.py), so that they cannot
# drift apart. The self-check (opaque_subclass/cli/selfcheck.py) keeps its own
# small subclass: it is library code and does not import the tests.


@functools.cache
def _check_examples() -> types.ModuleType:
    """docs/check_examples.py, whose ``extract`` finds the runnable blocks."""
    spec = importlib.util.spec_from_file_location("check_examples", ROOT / "docs" / "check_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _registers_mesh(node: ast.stmt) -> bool:
    """``register_opaque(Mesh...)`` or ``<module>.register_opaque(Mesh...)``."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func, args = node.value.func, node.value.args
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return name == "register_opaque" and bool(args) and isinstance(args[0], ast.Name) and args[0].id == "Mesh"


@functools.cache
def _example(relpath: str) -> dict[str, Any]:
    """The namespace of the first code block of ``relpath`` that defines ``Mesh``,
    run with only its imports, its ``Mesh``/``MeshTensor`` class statements and
    the registration of ``Mesh``, in a fresh module."""
    for block in _check_examples().extract((ROOT / relpath).read_text()):
        tree = ast.parse("\n" * (block.line - 1) + block.code, filename=relpath)
        if not any(isinstance(n, ast.ClassDef) and n.name == "Mesh" for n in tree.body):
            continue
        kept = [
            n
            for n in tree.body
            if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, ast.ClassDef) and n.name in ("Mesh", "MeshTensor"))
            or _registers_mesh(n)
        ]
        module = types.ModuleType("_docs_example_" + re.sub(r"\W", "_", relpath))
        sys.modules[module.__name__] = module  # the classes' module, as for any importable class
        exec(compile(ast.Module(body=kept, type_ignores=[]), str(ROOT / relpath), "exec"), module.__dict__)
        return module.__dict__
    raise AssertionError(f"{relpath}: no python block defines class Mesh")


#: files whose examples define a Mesh (with its registration in the same block)
#: -> (the fixture it stands for, arguments that make one)
MESH_EXAMPLES: dict[str, tuple[type, tuple[Any, ...]]] = {
    "README.md": (subclasses.Mesh, ("dp",)),
    "docs/authoring.md": (subclasses.Mesh, ("dp",)),
    "docs/backport.md": (subclasses.Mesh, ("dp",)),
    "docs/compatibility.md": (subclasses.Mesh, ()),
    "docs/compile_passes.md": (subclasses.ValueMesh, (2, "pg")),  # == compares the layout, as DeviceMesh's
    "docs/core.md": (subclasses.Mesh, ("dp",)),
    "docs/distributed.md": (subclasses.Mesh, ()),
    "docs/export.md": (subclasses.Mesh, ("dp",)),
}
#: files whose examples define a MeshTensor(data, mesh, *extra) of the fixture's
#: layout -> the extra constructor arguments
MESH_TENSOR_EXAMPLES: dict[str, tuple[Any, ...]] = {
    "README.md": (),
    "docs/backport.md": (),
    "docs/compatibility.md": (),
    "docs/authoring.md": ("t",),  # a metadata attribute, in the flatten context
}


@pytest.mark.parametrize("relpath", sorted(MESH_EXAMPLES))
def test_docs_mesh_is_a_reference_opaque_like_the_fixture(relpath):
    fixture, args = MESH_EXAMPLES[relpath]
    docs = _example(relpath)["Mesh"]
    assert osc.opaque_kind(docs) == osc.opaque_kind(fixture) == "reference", relpath
    a, b = docs(*args), docs(*args)
    assert osc.opaque_kind(a) == "reference" and osc.is_opaque(a)
    # Equality agrees with the fixture's: identity, or the layout for ValueMesh.
    assert (a == b) == (fixture(*args) == fixture(*args)), relpath


def _behaviour(cls: type, mesh: Any, extra: tuple[Any, ...]) -> dict[str, Any]:
    """What the tests rely on in a MeshTensor: its flatten names and slots, that
    flatten/unflatten give back the very mesh, and that an op's output carries it."""
    data = torch.arange(3.0)
    x = cls(data, mesh, *extra)
    names, ctx = x.__tensor_flatten__()
    leaves, spec = osc.flatten_subclass(x)
    rebuilt = osc.unflatten_subclass(leaves, spec)
    direct = cls.__tensor_unflatten__({"_data": data, "_mesh": mesh}, ctx, x.shape, x.stride())
    out = x * 2
    return {
        "flatten names": list(names),
        "slots": [(path, type(slot).__name__) for path, slot in osc.iter_slots(spec, "x")],
        "mesh leaves": [i for i, leaf in enumerate(leaves) if leaf is mesh],
        "unflatten keeps the mesh": type(rebuilt) is cls and rebuilt._mesh is mesh and torch.equal(rebuilt._data, data),
        "__tensor_unflatten__ keeps the mesh": type(direct) is cls and direct._mesh is mesh,
        "ops keep the mesh": type(out) is cls and out._mesh is mesh and torch.equal(out._data, data * 2),
    }


@pytest.mark.parametrize("relpath", sorted(MESH_TENSOR_EXAMPLES))
def test_docs_mesh_tensor_behaves_like_the_fixture(relpath):
    namespace, mesh_args = _example(relpath), MESH_EXAMPLES[relpath][1]
    docs = _behaviour(namespace["MeshTensor"], namespace["Mesh"](*mesh_args), MESH_TENSOR_EXAMPLES[relpath])
    fixture = _behaviour(subclasses.MeshTensor, subclasses.Mesh(*mesh_args), ())
    assert docs == fixture, f"{relpath}'s MeshTensor differs from tests/subclasses.py's"
    assert fixture["flatten names"] == ["_data", "_mesh"] and fixture["mesh leaves"] == [1]
