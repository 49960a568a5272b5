"""The key compile scenarios on each device: inductor, the compile caches and CUDA graphs.

Every other test puts its tensors on the CPU. These re-run the scenarios that depend on
the device with the tensors on ``device`` (the fixture of ``tests/conftest.py``): "cpu"
always, "cuda" where torch sees a GPU; elsewhere the "cuda" cases are skipped with the
reason. ``python -m nox -s gpu`` runs this file on a GPU, and fails instead of skipping.

* inductor, forward and backward: each output (and gradient) carries its own call's
  opaque, one compilation serves several opaques, and the kernels are the device's
  (C++ on the CPU, Triton on CUDA); an opaque read from the subclass reaches a custom op;
* the compile caches: a fresh process reuses a program compiled by another one, and
  never the one compiled for another sharing of opaques;
* CUDA graphs (``mode="reduce-overhead"``) with opaque inputs: the outputs are right,
  and the test records whether the graph was CUDA-graphed (CUDA graphs recorded by
  torch's cudagraph trees, its skip counter and the reasons it gave).

Not yet run on a GPU: what the cuda cases of the CUDA-graph scenarios expect is read
from torch's sources (see ``_expected``). Each expectation is checked exactly, so the
first GPU run tells whether it holds: a predicted torch limitation that is observed as
predicted is reported as an xfail with what was seen; any other outcome fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch._inductor.cudagraph_utils
import torch._inductor.output_code
from subclasses import Mesh, MeshTensor, add_name_length
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

import opaque_subclass as osc
from opaque_subclass.testing import warm

ROOT = Path(__file__).resolve().parent.parent
NATIVE = osc.support().mode == "native"
# What inductor's generated wrapper code compiles its kernels with, per device.
KERNELS = {"cpu": "async_compile.cpp_pybinding(", "cuda": "async_compile.triton("}


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    # Each scenario counts its own compilations and CUDA graphs; torch's compile
    # caches stay on. (torch._dynamo.reset also resets the cudagraph trees.)
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _problems(out: Any, mesh: Mesh, expected: torch.Tensor, device: str, what: str) -> list[str]:
    """What is wrong with ``out`` (a MeshTensor on ``device`` around ``mesh`` and ``expected``)."""
    if type(out) is not MeshTensor:
        return [f"{what}: a {type(out).__name__}, not a MeshTensor"]
    found = []
    if out._mesh is not mesh:
        found.append(f"{what}: mesh {out._mesh!r}, not this call's {mesh!r}")
    if out.device.type != device or out._data.device.type != device:
        found.append(f"{what}: on {out.device} (data on {out._data.device}), not on {device}")
    elif not torch.equal(out._data, expected):
        found.append(f"{what}: {out._data.tolist()}, not {expected.tolist()}")
    return found


# ------------------------------------------------------------------ inductor


def test_inductor_forward_each_output_carries_its_calls_opaque(device):
    cnt = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    f = torch.compile(lambda x: x * 2 + 1, backend=cnt, fullgraph=True)
    first = Mesh("m0")
    out, code = run_and_get_code(f, MeshTensor(torch.zeros(3, device=device), first))
    assert KERNELS[device] in "".join(code), code  # the device's kernels, not another's
    problems = _problems(out, first, torch.ones(3, device=device), device, "call 0")
    for i in range(1, 4):
        mesh = Mesh(f"m{i}")
        out = f(MeshTensor(torch.full((3,), float(i), device=device), mesh))
        problems += _problems(out, mesh, torch.full((3,), 2.0 * i + 1, device=device), device, f"call {i}")
    assert problems == []
    assert cnt.frame_count == 1  # one compilation for four meshes


def test_inductor_backward_grad_carries_its_calls_opaque(device):
    cnt = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    f = torch.compile(lambda x: (x * x).sum(), backend=cnt, fullgraph=True)
    problems = []
    for i in range(3):
        mesh = Mesh(f"g{i}")
        data = torch.arange(3.0, device=device) + i
        x = MeshTensor(data.clone(), mesh).requires_grad_(True)
        if i == 0:
            loss, code = run_and_get_code(f, x)
            assert KERNELS[device] in "".join(code), code
        else:
            loss = f(x)
        loss.backward()
        problems += _problems(x.grad, mesh, 2 * data, device, f"grad {i}")
    assert problems == []
    assert cnt.frame_count == 1


def test_inductor_guards_on_opaque_sharing(device):
    cnt = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    f = torch.compile(lambda x, y: (x + y, y * 2), backend=cnt, fullgraph=True)
    two = torch.full((2,), 2.0, device=device)
    problems = []
    shared, again = Mesh("s"), Mesh("t")
    for call, (m1, m2) in enumerate([(shared, shared), (Mesh("a"), Mesh("b")), (again, again)]):
        o1, o2 = f(MeshTensor(torch.ones(2, device=device), m1), MeshTensor(torch.ones(2, device=device), m2))
        problems += _problems(o1, m1, two, device, f"call {call} x + y")
        problems += _problems(o2, m2, two, device, f"call {call} y * 2")
    assert problems == []
    assert cnt.frame_count == 2  # one graph per sharing pattern


def test_inductor_custom_op_gets_the_opaque_of_each_call(device):
    """The mesh read from the subclass is an input of the graph and reaches the
    custom op (``t + len(mesh.name)``) as the object of each call."""
    cnt = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    f = torch.compile(lambda x: add_name_length(x._data, x._mesh) * 2, backend=cnt, fullgraph=True)
    got = {}
    for name in ("a", "bb", "ccc"):
        out = f(MeshTensor(torch.ones(2, device=device), Mesh(name)))
        assert out.device.type == device, out.device
        got[name] = out.tolist()
    assert got == {"a": [4.0, 4.0], "bb": [6.0, 6.0], "ccc": [8.0, 8.0]}
    assert cnt.frame_count == 1


# ------------------------------------------------------------------ compile caches


def _child() -> None:
    """A child process (``python -c "import test_devices; test_devices._child()" DEVICE
    CALLS``): calls one inductor program on two MeshTensors per call in CALLS
    ("shared": one mesh for both, "distinct": one each) and prints, per call, whether
    the outputs carry the call's meshes with the right values on DEVICE, and the change
    of AOTAutograd's cache counters."""
    device, calls = sys.argv[1], sys.argv[2].split(",")
    f = torch.compile(lambda x, y: (x - y, y * 3), backend="inductor", fullgraph=True)
    report = []
    for call in calls:
        if call == "shared":
            meshes = [Mesh("s")] * 2
        else:
            meshes = [Mesh("a"), Mesh("b")]
        before = dict(counters["aot_autograd"])
        o1, o2 = f(*(MeshTensor(torch.ones(2, device=device), m) for m in meshes))
        problems = _problems(o1, meshes[0], torch.zeros(2, device=device), device, "x - y")
        problems += _problems(o2, meshes[1], torch.full((2,), 3.0, device=device), device, "y * 3")
        after = counters["aot_autograd"]
        cache = {k: after[f"autograd_cache_{k}"] - before.get(f"autograd_cache_{k}", 0) for k in ("hit", "miss")}
        report.append({"call": call, "problems": problems, "cache": cache})
    print(json.dumps(report))


def _spawn(device: str, calls: str, cache_dir: Path) -> list[dict[str, Any]]:
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }
    out = warm.run(
        [sys.executable, "-c", "import test_devices; test_devices._child()", device, calls], timeout=600, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr[-5000:]
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_compile_cache_reuses_a_program_only_for_its_sharing(device, tmp_path):
    """Process A compiles for shared meshes. Process B, on the same cache directory,
    calls with shared meshes of its own: a hit, whose outputs carry B's meshes; then
    with distinct meshes: Dynamo recompiles (it guards on the sharing) and AOTAutograd's
    cache misses (A's program would return the first mesh twice)."""
    miss, hit = {"hit": 0, "miss": 1}, {"hit": 1, "miss": 0}
    assert _spawn(device, "shared", tmp_path) == [{"call": "shared", "problems": [], "cache": miss}]
    assert _spawn(device, "shared,distinct", tmp_path) == [
        {"call": "shared", "problems": [], "cache": hit},
        {"call": "distinct", "problems": [], "cache": miss},
    ]


# ------------------------------------------------------------------ CUDA graphs


@dataclasses.dataclass
class GraphReport:
    """What a run of a ``mode="reduce-overhead"`` program did."""

    problems: list[str]  # wrong outputs, per call
    error: str | None  # "Type: message" of what a call raised (the calls stop there)
    graphs: int  # graphs Dynamo compiled
    recorded: int  # CUDA graphs torch's cudagraph trees recorded
    skips: int  # counters["inductor"]["cudagraph_skips"]
    skip_messages: list[str]  # torch's "skipping cudagraphs due to ..." warnings
    fail_reasons: list[str]  # why inductor's check refused CUDA graphs, for graphs it meant to CUDA-graph


def _run_reduce_overhead(device: str, calls: int, call: Callable[[int], list[str]]) -> GraphReport:
    """Runs ``call(0)``, ``call(1)``, ... (each returns what was wrong with its outputs)
    as steps of CUDA graphs, and reports."""
    skip_messages: list[str] = []
    fail_reasons: list[str] = []

    def keep_reasons(original: Callable[..., None]) -> Callable[..., None]:
        # cudagraph_(partition_)post_compile(example_inputs, compiled_graph, ...): under
        # graph partitions (the default) a refusal is neither logged nor counted.
        def post_compile(*args: Any, **kwargs: Any) -> None:
            info = args[1].cudagraph_info
            fail_reasons.extend(info.cudagraph_fail_reasons if info is not None else ())
            original(*args, **kwargs)

        return post_compile

    output_code = torch._inductor.output_code
    log = torch._inductor.cudagraph_utils.cudagraphs_log
    problems: list[str] = []
    error = None
    with (
        mock.patch.object(log, "warning", side_effect=lambda msg, *a, **k: skip_messages.append(str(msg))),
        mock.patch.object(output_code, "cudagraph_post_compile", keep_reasons(output_code.cudagraph_post_compile)),
        mock.patch.object(
            output_code,
            "cudagraph_partition_post_compile",
            keep_reasons(output_code.cudagraph_partition_post_compile),
        ),
    ):
        for i in range(calls):
            torch.compiler.cudagraph_mark_step_begin()
            try:
                problems += call(i)
            except Exception as e:  # reported, and compared with the expected outcome
                error = f"{type(e).__name__}: {e}"
                break
    recorded = 0
    if device == "cuda":
        from torch._inductor.cudagraph_trees import get_manager

        manager = get_manager(torch.cuda.current_device(), False)
        recorded = manager.new_graph_id().id if manager is not None else 0  # ids 0.. went to recordings
    return GraphReport(
        problems=problems,
        error=error,
        graphs=counters["stats"]["unique_graphs"],
        recorded=recorded,
        skips=counters["inductor"]["cudagraph_skips"],
        skip_messages=skip_messages,
        fail_reasons=fail_reasons,
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The expected outcome of a CUDA-graph scenario on this release and device."""

    graphed: bool  # CUDA graphs recorded, nothing skipped
    reason: str = ""  # when not graphed: found in the fail reasons or skip messages
    error: str = ""  # a call raises this ("Type: message"), instead of returning
    limitation: str = ""  # torch's limitation that makes it so: the test xfails with it, once observed


_NON_TENSOR = Outcome(
    graphed=False,
    reason="non-Tensor inputs",
    limitation="torch 2.11 does not CUDA-graph a graph with an opaque input: its check accepts only "
    "Tensor, SymInt and Generator inputs, and the opaque reaches inductor as a FakeScriptObject "
    "(pytorch/pytorch#176615; 2.12 and newer accept opaques there); the graph runs without CUDA graphs",
)


def _expected(scenario: str, device: str) -> Outcome:
    """What each CUDA-graph scenario does.

    On the CPU, measured on 2.11 - 2.15: inductor does not CUDA-graph CPU graphs (it
    counts a skip), and the outputs are right. On CUDA, PREDICTED from torch's sources
    (``torch/_inductor/output_code.py``, ``cudagraph_trees.py``), not yet run on a GPU:

    * torch 2.11: never graphed, see ``_NON_TENSOR``;
    * torch 2.12 - 2.15: the check accepts opaque inputs and cudagraph trees keep them
      static: graphed, outputs right. Under graph partitions (inductor's default) only
      kernels are CUDA-graphed, and a subclass's opaque, which the graph returns so that
      the output subclass is rebuilt around it, is passed from input to output outside
      them. Without partitions the whole graph is recorded, and cudagraph trees accept
      only tensors, ints and None as outputs: the recording (second call) raises.
    """
    if device == "cpu":
        return Outcome(graphed=False)
    if not NATIVE:
        return _NON_TENSOR
    if scenario == "subclass-forward-no-partition":
        return Outcome(
            graphed=False,
            error="AssertionError: <class 'subclasses.Mesh'>",
            limitation="without graph partitions, torch's cudagraph trees refuse a graph that returns an opaque "
            "(CUDAGraphNode._record accepts tensors, ints and None as outputs)",
        )
    return Outcome(graphed=True)


def _check(report: GraphReport, expected: Outcome, device: str) -> None:
    """Asserts that ``report`` is the ``expected`` outcome; xfails with torch's
    limitation when that is what was expected, and seen."""
    assert report.problems == [], report
    if expected.error:
        assert report.error == expected.error, report
    else:
        assert report.error is None, report
        assert report.graphs == 1, report  # one compilation for every call's opaques
    if expected.graphed:
        assert report.recorded >= 1 and report.skips == 0 and report.fail_reasons == [], report
    elif device == "cpu":
        assert report.recorded == 0 and report.skips >= 1, report  # counted, not logged
    elif not expected.error:
        assert report.recorded == 0, report
        assert any(expected.reason in r for r in report.fail_reasons + report.skip_messages), report
    if expected.limitation:
        pytest.xfail(f"torch {torch.__version__}: {expected.limitation}; seen: {report}")


CALLS = 4


@pytest.mark.parametrize("partition", [True, False], ids=["partition", "no-partition"])
def test_cuda_graphs_subclass_forward(device, partition):
    f = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead", fullgraph=True)

    def call(i: int) -> list[str]:
        mesh = Mesh(f"m{i}")
        out = f(MeshTensor(torch.full((3,), float(i), device=device), mesh))
        return _problems(out, mesh, torch.full((3,), 2.0 * i + 1, device=device), device, f"call {i}")

    with torch._inductor.config.patch(graph_partition=partition):
        report = _run_reduce_overhead(device, CALLS, call)
    scenario = "subclass-forward" if partition else "subclass-forward-no-partition"
    _check(report, _expected(scenario, device), device)


def test_cuda_graphs_subclass_training_step(device):
    f = torch.compile(lambda x: (x * x).sum(), mode="reduce-overhead", fullgraph=True)

    def call(i: int) -> list[str]:
        mesh = Mesh(f"g{i}")
        data = torch.arange(3.0, device=device) + i
        x = MeshTensor(data.clone(), mesh).requires_grad_(True)
        f(x).backward()
        return _problems(x.grad, mesh, 2 * data, device, f"grad {i}")

    report = _run_reduce_overhead(device, CALLS, call)
    _check(report, _expected("subclass-training-step", device), device)


def test_cuda_graphs_custom_op_with_reference_opaque(device):
    """pytorch/pytorch#176615's case: a custom op taking a reference opaque (here
    read from the subclass). The op reads ``len(mesh.name)`` on the host, which a
    CUDA graph replays as recorded (an op whose result depends on host state must be
    tagged ``torch.Tag.cudagraph_unsafe``): the meshes' names have one length, so
    the right outputs are the same with and without CUDA graphs."""
    f = torch.compile(lambda x: add_name_length(x._data, x._mesh) * 2, mode="reduce-overhead", fullgraph=True)

    def call(i: int) -> list[str]:
        data = torch.full((2,), float(i), device=device)
        out = f(MeshTensor(data.clone(), Mesh(f"m{i}")))
        expected = (data + 2) * 2
        if type(out) is not torch.Tensor or out.device.type != device or not torch.equal(out, expected):
            return [f"call {i}: {out!r}, not {expected!r}"]
        return []

    report = _run_reduce_overhead(device, CALLS, call)
    _check(report, _expected("custom-op", device), device)
