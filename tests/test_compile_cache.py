"""torch's compile caches stay on and never serve a graph compiled for one
sharing of opaques to a call with another.

On native torch (2.12 - 2.15) AOTAutograd's cache key hashes an opaque by its
type, so it used to serve the graph compiled for ``x._mesh is y._mesh`` to a
call with distinct meshes (both outputs carried the first mesh). The native
fix (``opaque_subclass.backport.native.autograd_cache``) keys the sharing
pattern. Each test uses its own fresh cache directory; no cache is turned off.
On torch 2.11 the backport's graphs are not affected: the same checks run there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opaque_subclass as osc
from opaque_subclass._versions import current

ROOT = Path(__file__).resolve().parent.parent
CACHE_FIX = "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key"

# One process: a call with shared meshes, then one with distinct meshes; prints
# the outputs' meshes and the AOTAutograd cache counters.
_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import opaque_subclass as osc
    from torch._dynamo.utils import counters
    from subclasses import Mesh, MeshTensor

    if "stock" in sys.argv:
        osc.disable()
    f = torch.compile(lambda x, y: (x + y, y * 2), backend="inductor", fullgraph=True)
    for call in sys.argv[1].split(","):
        if call == "shared":
            m = Mesh("s")
            x, y = MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), m)
        else:
            x, y = MeshTensor(torch.ones(2), Mesh("a")), MeshTensor(torch.ones(2), Mesh("b"))
        o1, o2 = f(x, y)
        ok = o1._mesh is x._mesh and o2._mesh is y._mesh and torch.equal(o1._data, torch.full((2,), 2.0))
        print(call, "OK" if ok else f"WRONG {o1._mesh} {o2._mesh}")
    print("hits", counters["aot_autograd"]["autograd_cache_hit"])
    """
)


def _run(calls: str, cache_dir: Path, *flags: str) -> list[str]:
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, calls, *flags], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr[-5000:]
    return out.stdout.split("\n")


def test_cache_key_is_replaced_on_every_supported_release():
    # native: a fix of torch's bug; 2.11: keeps backport entries apart from stock torch's
    if osc.support().mode == "native":
        assert CACHE_FIX in osc.support().fixes
    else:
        assert CACHE_FIX in osc.support().patched


def test_one_process_shared_then_distinct(tmp_path):
    lines = _run("shared,distinct", tmp_path)
    assert lines[:2] == ["shared OK", "distinct OK"], lines


def test_across_processes_sharing_a_cache_dir(tmp_path):
    # The writer compiles only the shared case; the reader's *first* call has
    # distinct meshes and must not get the writer's graph.
    assert _run("shared", tmp_path)[0] == "shared OK"
    lines = _run("distinct", tmp_path)
    assert lines[0] == "distinct OK", lines
    # The cache still works: the same sharing in a third process is a hit.
    lines = _run("shared", tmp_path)
    assert lines[0] == "shared OK" and lines[1] == "hits 1", lines


@pytest.mark.skipif(osc.support().mode != "native", reason="the bug is native torch's")
def test_stock_torch_serves_the_wrong_mesh(tmp_path):
    """Negative control: with the library's patches and fixes removed, the bug is
    there on this release (when upstream fixes it, this fails: drop the fix)."""
    lines = _run("shared,distinct", tmp_path, "stock")
    assert lines[0] == "shared OK" and lines[1].startswith("distinct WRONG"), lines


def test_no_opaque_keeps_torchs_key():
    from subclasses import Mesh, MeshTensor

    from opaque_subclass.backport.native.autograd_cache import sharing_key

    assert sharing_key([torch.ones(2), 3]) is None
    m = Mesh("k")
    shared = sharing_key([MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), m)])
    distinct = sharing_key([MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), Mesh("other"))])
    again = sharing_key([MeshTensor(torch.ones(2), Mesh("x")), MeshTensor(torch.ones(2), Mesh("y"))])
    assert shared != distinct and distinct == again  # the pattern, not the objects
    assert current().mode in ("native", "backport")
