"""Beside other packages that patch the same torch functions (#35, item 1).

A stand-in (``tests/other_patchers``) replaces AOTAutograd's
``process_runtime_tangent``, which the library patches on every release (the
backport's row on 2.11, a fix on 2.12 - 2.15), the way NVIDIA PhysicsNeMo 2.2
does. Each case runs in a fresh interpreter:

* imported before the library, a stand-in that wraps torch's function gets the
  library's replacement built over it: every patch and fix is installed,
  ``support().others`` names the package and its function, both run, and
  ``disable()`` gives the stand-in's function back, not torch's;
* imported after, the stand-in wraps the library's replacement; ``disable()``
  leaves it (and ours beneath it) in place and says so, ``enable()`` does not
  stack a second replacement;
* a stand-in that does not call torch's function blocks only that target: a
  native release installs every other fix and names the package, the function
  and a fix that runs as written (importing the library first); torch 2.11's
  backport, whose patches provide one feature together, is refused with that
  cause instead of "install the official release";
* threads: the stand-in installed on another thread while the library is
  turned on and off never loses either package's patch.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import opaque_subclass as osc
from opaque_subclass.testing import warm

ROOT = Path(__file__).resolve().parents[1]
TARGET = "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent"
BACKPORT = osc.support().mode == "backport"

# The chain of functions at the target, top first: ("ours" | "stand-in" | "torch"), read
# through each function's closure.
CHAIN = """
import json, warnings

def import_library():
    # import opaque_subclass, and the messages of the warnings it gave
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import opaque_subclass
    from opaque_subclass.releases import current
    return opaque_subclass, current(), [str(w.message) for w in caught]

def chain():
    from opaque_subclass.patching import _wrapped_functions  # here: importing it enables the library
    from torch._functorch._aot_autograd import runtime_wrappers
    top = runtime_wrappers.AOTDispatchAutograd.__dict__["process_runtime_tangent"].__func__
    out = []
    for fn in (top, *_wrapped_functions(top, depth=4)):
        module = fn.__module__.split(".")[0]
        name = {"opaque_subclass": "ours", "other_patchers": "stand-in", "torch": "torch"}.get(module)
        if name is not None and fn.__name__ in ("process_runtime_tangent", "_process_runtime_tangent"):
            out.append(name)
    return out
"""


def _run(code: str, tmp_path: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-cache")
    out = warm.run([sys.executable, "-c", CHAIN + textwrap.dedent(code)], timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_wrapper_imported_first_gets_ours_built_over_it_and_back_on_disable(tmp_path):
    got = _run(
        """
        import other_patchers.wrapping as stand_in
        osc, row, warned = import_library()
        on = osc.support()
        enabled_chain = chain()
        off = osc.disable()
        disabled_chain = chain()
        again = osc.enable()
        print(json.dumps({
            "mode": on.mode, "problem": on.problem, "others": on.others,
            "installed": len(on.patched) + len(on.fixes), "rows": len(row.patches) + len(row.fixes),
            "warnings": [w for w in warned if "opaque_subclass" in w],
            "enabled": enabled_chain, "disabled": disabled_chain, "off_others": off.others,
            "again": chain(), "again_installed": len(again.patched) + len(again.fixes),
        }))
        """,
        tmp_path,
    )
    assert got["mode"] == ("backport" if BACKPORT else "native") and got["problem"] is None, got
    assert got["installed"] == got["rows"] > 0 and got["warnings"] == []
    [line] = got["others"]
    assert line.startswith(f"{TARGET} (replaced by other_patchers: other_patchers.wrapping.install.")
    assert line.endswith("_process_runtime_tangent): ours is built over it")
    assert got["enabled"] == ["ours", "stand-in", "torch"]
    assert got["disabled"] == ["stand-in", "torch"] and got["off_others"] == []
    assert got["again"] == ["ours", "stand-in", "torch"] and got["again_installed"] == got["rows"]


def test_both_run_in_a_compiled_backward_whichever_came_first(tmp_path):
    """The stand-in's function and the library's both see the tangent of a compiled
    backward, in either import order, and the gradient is eager's."""
    body = """
        import torch
        from subclasses import Mesh, MeshTensor
        mesh = Mesh("dp")
        f = torch.compile(lambda t: t * 3, backend="aot_eager", fullgraph=True)
        x = MeshTensor(torch.randn(4), mesh).requires_grad_(True)
        f(x).backward(MeshTensor(torch.ones(4), mesh))
        print(json.dumps({"calls": stand_in.CALLS, "grad": x.grad._data.tolist(), "chain": chain()}))
        """
    body = textwrap.dedent(body)
    first = _run("import other_patchers.wrapping as stand_in\nimport opaque_subclass\n" + body, tmp_path)
    second = _run("import opaque_subclass\nimport other_patchers.wrapping as stand_in\n" + body, tmp_path)
    for got in (first, second):
        assert got["calls"] and got["grad"] == [3.0] * 4, got
    assert first["chain"] == ["ours", "stand-in", "torch"]
    assert second["chain"] == ["stand-in", "ours", "torch"]


def test_a_wrapper_imported_after_stays_on_disable_with_ours_beneath(tmp_path):
    got = _run(
        """
        import opaque_subclass as osc
        import other_patchers.wrapping as stand_in
        installed = len(osc.support().patched) + len(osc.support().fixes)
        after = chain()
        off = osc.disable()
        disabled = chain()
        again = osc.enable()
        print(json.dumps({"after": after, "disabled": disabled, "off_others": off.others, "off_problem": off.problem,
                          "again": chain(), "installed": installed,
                          "again_installed": len(again.patched) + len(again.fixes)}))
        """,
        tmp_path,
    )
    assert got["after"] == ["stand-in", "ours", "torch"]
    # removing ours would remove the stand-in's patch (it calls ours): both stay, and support() says so
    assert got["disabled"] == ["stand-in", "ours", "torch"]
    [line] = got["off_others"]
    assert line.startswith(f"{TARGET} (replaced by other_patchers: ") and line.endswith(
        "after opaque_subclass: disable() keeps it, and ours beneath it"
    )
    assert got["again"] == ["stand-in", "ours", "torch"] and got["again_installed"] == got["installed"]


def test_a_rewrite_blocks_its_target_only_and_is_named(tmp_path):
    got = _run(
        """
        import other_patchers.rewriting
        osc, row, warned = import_library()
        s = osc.support()
        print(json.dumps({"mode": s.mode, "problem": s.problem, "fixes": s.fixes, "rows": [p.target for p in row.fixes],
                          "others": s.others, "warnings": warned}))
        """,
        tmp_path,
    )
    cause = (
        f"{TARGET} (replaced by other_patchers: other_patchers.rewriting.install.<locals>.process_runtime_tangent) "
        "before opaque_subclass: it does not call the torch function this patch was written against"
    )
    fix = "Fix: import opaque_subclass before other_patchers (that package's patch is then built over ours)"
    assert cause in got["problem"] and fix in got["problem"], got["problem"]
    assert not any("install the official release" in w for w in got["warnings"]), got["warnings"]
    if BACKPORT:  # the backport's patches provide the feature together: refused, with the real cause
        assert got["mode"] == "unsupported" and got["fixes"] == []
        assert any(cause in w for w in got["warnings"])
    else:
        assert got["mode"] == "native"
        assert got["fixes"] == [t for t in got["rows"] if t != TARGET] and len(got["fixes"]) == len(got["rows"]) - 1
        [warning] = [w for w in got["warnings"] if "opaque_subclass" in w]
        assert f"1 of the {len(got['rows'])} fixes for torch" in warning and cause in warning
        assert got["others"] == [f"{cause.split(' before ')[0]}: our fix is left out"]


def test_the_fix_runs_as_written(tmp_path):
    """The message's fix, importing the library first, installs every row with the same stand-in."""
    got = _run(
        """
        osc, row, _ = import_library()
        import other_patchers.rewriting
        s = osc.support()
        print(json.dumps({"installed": len(s.patched) + len(s.fixes), "rows": len(row.patches) + len(row.fixes),
                          "problem": s.problem}))
        """,
        tmp_path,
    )
    assert got["installed"] == got["rows"] and got["problem"] is None


def test_a_stand_in_installed_on_another_thread_while_enable_and_disable_run(tmp_path):
    """Neither package's patch is lost, whatever the interleaving: after the
    stand-in is imported on this thread while another turns the library on and
    off, and the library is turned on again, the chain holds the stand-in's
    function once, ours once and torch's at the bottom."""
    got = _run(
        """
        import sys, threading, time
        import opaque_subclass as osc
        import torch._dynamo  # before runtime_wrappers: torch's own import order needs it
        from torch._functorch._aot_autograd import runtime_wrappers
        cls = runtime_wrappers.AOTDispatchAutograd
        osc.disable()
        torch_own = cls.__dict__["process_runtime_tangent"]
        chains = []
        for trial in range(20):
            osc.disable()
            cls.process_runtime_tangent = torch_own  # the test's reset: torch's own, no stand-in
            sys.modules.pop("other_patchers.wrapping", None)
            osc.enable()
            stop = threading.Event()

            def toggle():
                while not stop.is_set():
                    osc.disable()
                    osc.enable()

            toggler = threading.Thread(target=toggle)
            toggler.start()
            time.sleep(0.002 * (trial % 5))
            import other_patchers.wrapping
            time.sleep(0.002 * (trial % 3))
            stop.set()
            toggler.join()
            osc.enable()
            chains.append(chain())
        print(json.dumps({"chains": chains}))
        """,
        tmp_path,
    )
    for chain in got["chains"]:
        assert sorted(chain) == ["ours", "stand-in", "torch"] and chain[-1] == "torch", got["chains"]


@pytest.mark.parametrize("order", ["before", "after"])
def test_cli_names_the_other_package(tmp_path, order):
    lines = ["import other_patchers.wrapping", "from opaque_subclass import cli"]
    if order == "after":
        lines.reverse()
    got = _run(
        "\n".join(lines)
        + """
import contextlib, io
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = cli.main(["--no-demo"])
print(json.dumps({"code": code, "printed": out.getvalue()}))
""",
        tmp_path,
    )
    assert got["code"] == 0, got["printed"]
    if order == "before":
        assert "other patchers  1 torch function(s) also replaced by other packages" in got["printed"]
        assert f"  - {TARGET} (replaced by other_patchers: " in got["printed"]
    else:
        assert "other patchers" not in got["printed"]
