"""The version check comes before anything release-specific (opaque_subclass.gate).

torch 2.10 lacks names the API imports at module level (``torch._opaque_base``,
``torch._library.opaque_object.MemberType``, ...). ``import opaque_subclass`` asks
the release table first and, on a refused torch, imports only the gate's
surface. Two checks keep it so: a static one over the source (every module that
``import opaque_subclass`` runs before or instead of the supported API imports
nothing from torch but ``torch`` itself) and a simulated torch 2.10 in a fresh
interpreter (no torch module may be imported after ``import torch``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from test_architecture import _target as _resolve  # a relative import's absolute name

ROOT = Path(__file__).resolve().parents[1]


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _top_level_imports(body: list[ast.stmt], skip_supported_branch: bool) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module runs: module level, inside ``if``/``try``
    blocks, never inside functions or classes. ``skip_supported_branch``: in the
    package's ``__init__``, the branch taken on a supported torch is left out."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if skip_supported_branch and "REFUSAL" in ast.unparse(node.test):
                found += _top_level_imports(node.orelse, False)
            else:
                found += _top_level_imports(node.body, False) + _top_level_imports(node.orelse, False)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                found += _top_level_imports(block, False)
    return found


def refused_torch_imports(entry: str = "opaque_subclass") -> tuple[set[str], list[str]]:
    """``(library modules run, torch imports below torch's top level)`` when
    ``entry`` is imported on a refused torch."""
    seen: set[str] = set()
    below_torch: list[str] = []
    todo = [entry]
    while todo:
        module = todo.pop()
        path = _module_path(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        # a submodule's import runs its packages' __init__ first
        todo += [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
        tree = ast.parse(path.read_text(), str(path))
        for node in _top_level_imports(tree.body, skip_supported_branch=module == entry):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                target = _resolve(module, path.name == "__init__.py", node)
                names = [target] + [f"{target}.{a.name}" for a in node.names]
                if target == "torch":
                    names = [f"torch.{a.name}" for a in node.names]
            for name in names:
                if name == "torch" or name.startswith("torch."):
                    if name != "torch":
                        below_torch.append(f"{module}: {name}")
                elif name.split(".")[0] == "opaque_subclass":
                    todo.append(name)
    return seen, below_torch


def test_nothing_below_torch_is_imported_before_the_version_check():
    modules, below = refused_torch_imports()
    assert below == [], f"reachable from `import opaque_subclass` on a refused torch: {below}"
    assert "opaque_subclass.gate" in modules and "opaque_subclass.releases.v2_11" in modules, modules
    assert not any(m.startswith(("opaque_subclass.core.registry", "opaque_subclass.activation")) for m in modules)


def test_the_static_check_can_fail():
    """The supported API imports torch's machinery by name (what torch 2.10 lacks):
    the same walk, run from the modules of the supported branch, finds it."""
    _, below = refused_torch_imports("opaque_subclass.core.registry")
    assert "opaque_subclass.core.registry: torch._library.opaque_object.MemberType" in below, below


SIMULATED_210 = textwrap.dedent(
    """
    import importlib.abc, sys, warnings
    import torch

    class NothingNew(importlib.abc.MetaPathFinder):
        # torch 2.10 lacks some modules (torch._opaque_base) and names the API imports
        # (MemberType): after `import torch`, no torch module may be imported at all
        def find_spec(self, name, path=None, target=None):
            if name.startswith("torch."):
                raise ModuleNotFoundError(f"simulated torch 2.10 has no {name!r} (imported after the check)")
            return None

    sys.meta_path.insert(0, NothingNew())
    for name in ("torch._opaque_base", "torch._custom_class_base", "torch._library.opaque_object"):
        sys.modules.pop(name, None)
    torch.__version__ = "2.10.0"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import opaque_subclass as osc
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SIMULATED_210 + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_simulated_torch_210_imports_the_gate_only_and_refuses_cleanly():
    out = _run(
        """
        assert osc.support().mode == "unsupported" and osc.support().patched == (), osc.support()
        assert osc.enable() == osc.disable() == osc.support()
        [w] = [w for w in caught if "is not supported" in str(w.message)]
        assert "torch 2.10.0 is not supported (no opaque base class" in str(w.message), w
        assert "Fix: python -m pip install 'torch>=2.11'" in str(w.message), w
        loaded = sorted(m for m in sys.modules if m.startswith("opaque_subclass"))
        print("LOADED", loaded)
        try:
            from opaque_subclass import OpaqueSubclass
        except ImportError as e:
            print("REFUSED", e)
        try:
            osc.flatten_subclass
        except ImportError as e:
            assert e.name == "flatten_subclass", e.name
        assert not hasattr(osc, "no_such_name")
        """
    )
    assert out.returncode == 0, out.stdout + out.stderr
    loaded = eval(out.stdout.split("LOADED ", 1)[1].splitlines()[0])
    modules, _ = refused_torch_imports()
    assert set(loaded) <= modules, set(loaded) - modules
    assert "opaque_subclass.core.registry" not in loaded
    refused = out.stdout.split("REFUSED ", 1)[1]
    assert refused.startswith("opaque_subclass.OpaqueSubclass needs a supported torch: torch 2.10.0 is not supported")
    assert "Fix: python -m pip install 'torch>=2.11'" in refused


def test_simulated_torch_210_cli_exits_1_with_the_unsupported_line():
    out = _run(
        """
        import runpy
        sys.argv = ["python -m opaque_subclass"]
        runpy.run_module("opaque_subclass", run_name="__main__", alter_sys=True)
        """
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "mode            unsupported" in out.stdout
    assert "torch 2.10 is not supported: no opaque base class" in out.stdout
    assert "Fix: python -m pip install 'torch>=2.11'" in out.stdout
    assert "checks:" not in out.stdout and "Traceback" not in out.stderr, out.stderr
