"""The PhysicsNeMo preset on NVIDIA PhysicsNeMo itself (``nvidia-physicsnemo`` 2.2.x).

Collected only where PhysicsNeMo is installed (``python -m nox -s clients``, on
torch 2.13.0 and 2.15.0; the default legs test the stand-in, tests/test_adopt.py).
Each scenario runs in a fresh interpreter with an inductor cache of its own:
importing ``physicsnemo.domain_parallel`` replaces AOTAutograd's
``process_runtime_tangent`` for the whole process.

* Import order: PhysicsNeMo imported before or after the library, every fix of
  the release is installed, ``support()`` (or ``disable()``) names PhysicsNeMo's
  replacement, and ``disable()`` never removes PhysicsNeMo's patch.
* Eight ``DeviceMesh``es of one shape over eight fake process groups,
  ``ShardTensor.from_local(..., [Shard(0)])`` on each, ``t * 2 + 1`` compiled
  once: stock, 7 of 8 outputs and gradients carry the first call's mesh;
  adopted with :func:`opaque_subclass.adoption.physicsnemo_shard_tensor`, none.
* ``ShardTensor.redistribute(mesh, [Replicate()])`` compiled with inductor on the
  same eight meshes: adopted, under ``share_compiles``, every call's all-gather
  runs on its own mesh's group with one compilation; stock, the graph names the
  first call's group, so 7 of 8 calls run on another call's group.
* Two real gloo ranks: the adopted class compiled forward and backward equals
  eager, values and gradients, each gradient on its call's mesh.
* A simulated 64-rank job on an (8, 8) mesh (tests/physicsnemo_steps.py): one
  AOTAutograd cache miss for the job, each rank's collectives on its own groups.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("physicsnemo") is None, reason="nvidia-physicsnemo is not installed"
)

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = textwrap.dedent(
    """
    import json, sys
    import torch, torch._dynamo.testing
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import opaque_subclass
    from physicsnemo.domain_parallel import ShardTensor

    backend, adopt = sys.argv[1], sys.argv[2] == "adopt"
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    meshes = [DeviceMesh.from_group(dist.new_group([0, 1]), "cpu") for _ in range(8)]


    def shard(local, mesh):
        return ShardTensor.from_local(local, mesh, [Shard(0)], sharding_shapes="chunk", global_shape=(8,))


    shard(torch.ones(4), meshes[0])  # its first construction sets ShardTensor._enable_shard_patches
    before = dict(vars(ShardTensor))
    adoption = opaque_subclass.adoption.physicsnemo_shard_tensor() if adopt else None


    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    f = torch.compile(lambda t: t * 2 + 1, backend=counter)
    out_meshes, grad_meshes, values = [], [], []
    for mesh in meshes:
        x = shard(torch.arange(4.0), mesh).detach().requires_grad_(True)
        out = f(x)
        out.backward(shard(torch.ones(4), mesh))
        out_meshes.append(next(i for i, m in enumerate(meshes) if m is out._spec.mesh))
        grad_meshes.append(next(i for i, m in enumerate(meshes) if m is x.grad._spec.mesh))
        values.append([out._local_tensor.tolist(), x.grad._local_tensor.tolist()])
    report = {
        "outputs": out_meshes,
        "gradients": grad_meshes,
        "values": values[0],
        "compilations": counter.frame_count,
        "flatten names": ShardTensor.from_local(
            torch.ones(4), meshes[0], [Shard(0)], sharding_shapes="chunk", global_shape=(8,)
        ).__tensor_flatten__()[0],
    }
    if adoption is not None:
        adoption.undo()
        after = dict(vars(ShardTensor))
        report["changed"] = sorted(k for k in before.keys() | after.keys() if before.get(k) is not after.get(k))
    dist.destroy_process_group()
    print("REPORT " + json.dumps(report))
    """
)


def _env(cache: Path) -> dict[str, str]:
    """The checkout (and tests/) on the path, and an inductor cache of the process's own."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    return env


def _run(tmp_path: Path, code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (bounded: 900 s) and return its ``REPORT`` line's JSON."""
    cache = tmp_path / f"inductor-cache-{len(list(tmp_path.glob('inductor-cache-*')))}"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=_env(cache),
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert proc.returncode == 0 and line is not None, proc.stdout[-5000:] + proc.stderr[-20000:]
    return json.loads(line.removeprefix("REPORT "))  # type: ignore[no-any-return]  # a JSON object


def test_stock_shard_tensor_is_stale(tmp_path):
    report = _run(tmp_path, SCENARIO, "aot_eager", "stock")
    assert report["outputs"] == [0] * 8 and report["gradients"] == [0] * 8, report
    assert report["compilations"] == 1 and report["flatten names"] == ["_local_tensor"]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_adopted_shard_tensor_runs_on_each_calls_mesh(tmp_path, backend):
    report = _run(tmp_path, SCENARIO, backend, "adopt")
    assert report["outputs"] == list(range(8)) and report["gradients"] == list(range(8)), report
    assert report["compilations"] == 1 and report["flatten names"] == ["_local_tensor", "_mesh"]
    assert report["values"] == [[1.0, 3.0, 5.0, 7.0], [2.0, 2.0, 2.0, 2.0]]
    assert report["changed"] == [], report["changed"]


def test_the_preset_refuses_another_release(monkeypatch):
    import importlib.metadata

    import opaque_subclass as osc

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.3.0")
    with pytest.raises(osc.OpaqueValueError, match=r"written against nvidia-physicsnemo 2\.2\.x, and 2\.3\.0"):
        osc.adoption.physicsnemo_shard_tensor()
    assert not osc.adoptions()


# ------------------------------------------------------------------ import order

TARGET = "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent"
SHIM = "physicsnemo.domain_parallel.shard_tensor.install_aot_plain_tangent_coercion.<locals>._process_runtime_tangent"

IMPORT_ORDER = textwrap.dedent(
    """
    import json, sys, warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if sys.argv[1] == "before":
            import physicsnemo.domain_parallel
            import opaque_subclass
        else:
            import opaque_subclass
            import physicsnemo.domain_parallel
    from torch._functorch._aot_autograd import runtime_wrappers

    from opaque_subclass.patching import _wrapped_functions
    from opaque_subclass.releases import current


    def chain():
        # the functions at the target, top first: "ours", "physicsnemo" or "torch"
        top = runtime_wrappers.AOTDispatchAutograd.__dict__["process_runtime_tangent"].__func__
        names = {"opaque_subclass": "ours", "physicsnemo": "physicsnemo", "torch": "torch"}
        return [
            names[fn.__module__.split(".")[0]]
            for fn in (top, *_wrapped_functions(top, depth=4))
            if fn.__module__.split(".")[0] in names and fn.__name__ in ("process_runtime_tangent", "_process_runtime_tangent")
        ]


    def installed(s):
        return sorted([*s.patched, *s.fixes])


    row = current()
    on = opaque_subclass.support()
    enabled = chain()
    off = opaque_subclass.disable()
    disabled = chain()
    again = opaque_subclass.enable()
    print("REPORT " + json.dumps({
        "mode": on.mode, "problem": on.problem,
        "rows": sorted([*(p.target for p in row.patches), *(f.target for f in row.fixes)]),
        "installed": installed(on), "again": installed(again),
        "others": list(on.others), "off_others": list(off.others), "again_others": list(again.others),
        "warnings": [str(w.message) for w in caught if "opaque_subclass" in str(w.message)],
        "enabled": enabled, "disabled": disabled, "again_chain": chain(),
    }))
    """
)


@pytest.mark.parametrize("order", ["before", "after"])
def test_either_import_order_keeps_every_fix(tmp_path, order):
    """PhysicsNeMo replaces ``AOTDispatchAutograd.process_runtime_tangent`` on import
    (wrapping the function it finds), a target the library fixes on every release.
    Imported first, the library builds its fix over PhysicsNeMo's and ``support().others``
    names it; imported after, PhysicsNeMo wraps the library's, and ``disable()`` keeps both
    and says so. Either way every fix row of the release is installed, and ``disable()``
    never removes PhysicsNeMo's patch."""
    got = _run(tmp_path, IMPORT_ORDER, order)
    assert got["mode"] in ("native", "backport") and got["problem"] is None, got
    assert got["installed"] == got["rows"] and len(got["rows"]) > 0, got
    assert got["again"] == got["rows"], got
    assert got["warnings"] == [], got["warnings"]
    replaced = f"{TARGET} (replaced by physicsnemo: {SHIM})"
    if order == "before":
        assert got["others"] == [f"{replaced}: ours is built over it"], got["others"]
        assert got["enabled"] == ["ours", "physicsnemo", "torch"]
        # disable() gives PhysicsNeMo's function back, not torch's
        assert got["disabled"] == ["physicsnemo", "torch"] and got["off_others"] == []
        assert got["again_chain"] == ["ours", "physicsnemo", "torch"] and got["again_others"] == got["others"]
    else:
        assert got["enabled"] == ["physicsnemo", "ours", "torch"]
        # removing ours would remove PhysicsNeMo's patch (it calls ours): both stay, and disable() says so
        assert got["disabled"] == ["physicsnemo", "ours", "torch"], got["disabled"]
        assert got["off_others"] == [f"{replaced} after opaque_subclass: disable() keeps it, and ours beneath it"]
        assert got["again_chain"] == ["physicsnemo", "ours", "torch"]  # enable() stacks no second fix


# ------------------------------------------------------------------ collectives on each call's group

COLLECTIVES = textwrap.dedent(
    """
    import contextlib, json, logging, re, sys
    import torch, torch._dynamo.testing
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import opaque_subclass
    from opaque_subclass.dtensor import share_compiles
    from opaque_subclass.sharded import record_collectives
    from physicsnemo.domain_parallel import ShardTensor

    adopt = sys.argv[1] == "adopt"
    # the process groups AOTAutograd's graphs name (its graph log, before inductor's passes, so
    # before share_compiles' rewrite): the group a stock graph runs its collectives on
    named = []


    class Named(logging.Handler):
        def emit(self, record):
            named.extend(re.findall(r"_c10d_functional[.]\\w+[.]default[(][^\\n]*?'([^']+)'[)]", record.getMessage()))


    torch._logging.set_logs(aot_graphs=True)
    # on each logger of torch's that keeps its records (the artifact loggers are their children)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("torch") and isinstance(logger, logging.Logger) and not logger.propagate:
            logger.addHandler(Named())

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        meshes = [DeviceMesh.from_group(dist.new_group([0, 1]), "cpu") for _ in range(8)]
        own = [str(m.get_group().group_name) for m in meshes]


        def shard(mesh):
            return ShardTensor.from_local(
                torch.arange(4.0), mesh, [Shard(0)], sharding_shapes="chunk", global_shape=(8,)
            )


        def gathered(t, mesh):
            return t.redistribute(mesh, [Replicate()]).to_local() * 2


        shard(meshes[0])  # its first construction sets ShardTensor._enable_shard_patches
        adoption = opaque_subclass.adoption.physicsnemo_shard_tensor() if adopt else None
        counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
        f = torch.compile(gathered, backend=counter)
        ran, same = [], []
        with share_compiles() if adopt else contextlib.nullcontext():
            for mesh in meshes:
                with record_collectives() as seen:
                    out = f(shard(mesh), mesh)
                ran.append([(r.op, r.group_name) for r in seen])
                same.append(torch.equal(out, gathered(shard(mesh), mesh)))
        report = {
            "own": own, "ran": ran, "same as eager": same, "compilations": counter.frame_count,
            "graph groups": sorted(set(named)),
        }
        if adoption is not None:
            adoption.undo()
    finally:
        dist.destroy_process_group()
    print("REPORT " + json.dumps(report))
    """
)


def test_adopted_redistribute_runs_each_collective_on_its_calls_group(tmp_path):
    """``ShardTensor.redistribute(mesh, [Replicate()])`` compiled with inductor, adopted,
    under ``share_compiles``: the 8 calls all-gather on 8 groups, each its own mesh's,
    with one compilation (the mesh is a graph input; the all-gather becomes the library's
    op taking it)."""
    got = _run(tmp_path, COLLECTIVES, "adopt")
    assert len(set(got["own"])) == 8, got
    on_own = [[g for _, g in calls] == [own] for calls, own in zip(got["ran"], got["own"], strict=True)]
    assert on_own == [True] * 8, got  # 8 of 8 on their own group
    assert got["compilations"] == 1 and got["same as eager"] == [True] * 8, got


def test_stock_redistribute_runs_every_call_on_the_first_calls_group(tmp_path):
    """The same, stock (not adopted, not shared): one compilation, whose graph names the
    first call's group; the other 7 calls run it, on a group that is not theirs. (The
    library's record sees none of these collectives: they stay torch's ops.)"""
    got = _run(tmp_path, COLLECTIVES, "stock")
    assert got["compilations"] == 1 and got["graph groups"] == [got["own"][0]], got
    assert got["ran"] == [[]] * 8, got
    wrong = sum(own not in got["graph groups"] for own in got["own"])
    assert wrong == 7, got  # 7 of 8 on another call's group


# ------------------------------------------------------------------ real gloo ranks


def test_two_gloo_ranks_compiled_forward_and_backward_equal_eager(tmp_path, monkeypatch):
    """Two ranks, two meshes over them with a group each, a sharded ``ShardTensor`` of
    rank-dependent data on each: ``redistribute`` to ``Replicate`` and a loss, compiled
    with inductor (adopted), forward and backward, against the same eagerly. Equal
    losses and gradients; every gradient a ``ShardTensor`` on its call's mesh."""
    import torch

    from opaque_subclass.testing import run_local_workers

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    monkeypatch.setenv("PYTHONPATH", _env(tmp_path)["PYTHONPATH"])
    results = run_local_workers(f"{ROOT / 'tests' / 'physicsnemo_steps.py'}:gloo_train", 2, timeout=400)
    for rank, result in enumerate(results):
        assert result["compilations"] == 1, (rank, result)
        for call in result["calls"]:
            assert call["grad_on_call_mesh"] and call["eager_grad_on_call_mesh"], (rank, call)
            assert call["compiled"][0] == pytest.approx(call["eager"][0], rel=1e-6), (rank, call)
            compiled_grad, eager_grad = torch.tensor(call["compiled"][1]), torch.tensor(call["eager"][1])
            assert torch.allclose(compiled_grad, eager_grad, rtol=1e-6, atol=1e-6), (rank, call)
    # the gather saw both ranks' shards: one loss per call on both ranks
    assert [c["compiled"][0] for c in results[0]["calls"]] == pytest.approx(
        [c["compiled"][0] for c in results[1]["calls"]], rel=1e-6
    )


# ------------------------------------------------------------------ a simulated job


def test_a_simulated_64_rank_job_compiles_once_on_each_ranks_own_groups(tmp_path):
    """W=64 on an (8, 8) ``(dp, tp)`` mesh, 4 ranks no two of which share a group: each
    gathers a ``ShardTensor`` on its ``dp`` and its ``tp`` sub-mesh in one function
    compiled with inductor under ``share_compiles`` (tests/physicsnemo_steps.py). The job
    misses AOTAutograd's cache once (the first rank), the others load that entry, nothing
    bypasses or fails, and each rank's collectives ran on its own two groups."""
    from opaque_subclass.testing import simulate_job

    report = simulate_job(
        f"{ROOT / 'tests' / 'physicsnemo_steps.py'}:job_step",
        world_size=64,
        mesh_shape=(8, 8),
        mesh_dim_names=("dp", "tp"),
        payload={"global_size": 32},
        cache_dir=tmp_path / "job-cache",
        env={"PYTHONPATH": _env(tmp_path)["PYTHONPATH"]},
        timeout=600,
    )
    table = report.table()
    assert report.aot_misses == 1 and report.aot_bypasses == 0, table
    assert report.aot_hits == len(report.ranks) - 1 and report.compilations == len(report.ranks), table
    for r in report.ranks:
        assert r.value["collective_groups"] == r.value["own_groups"] and r.value["collectives"] == 2, (table, r)
        assert r.value["loss"] == pytest.approx(report.ranks[0].value["loss"]), (table, r)
    assert len({g for r in report.ranks for g in r.value["own_groups"]}) == 2 * len(report.ranks), table
