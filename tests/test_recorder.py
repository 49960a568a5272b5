"""The recorder: the one place the library's fixes record what torch traces,
which says whether a stream is recorded on this torch, and whose readers
(compile_passes, share_compiles) say so when it is not."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

import pytest
import torch
from subclasses import Gauge, GaugeTensor, Mesh

import compile_passes
import opaque_subclass
from opaque_subclass.core.recorder import RECORDER, STREAMS, Recorder


class _Key:
    """A weak-referenceable key, as a TracingContext or a tracer is."""


@contextlib.contextmanager
def _library_off() -> Iterator[None]:
    opaque_subclass.disable()
    try:
        yield
    finally:
        opaque_subclass.enable()


def test_each_stream_is_recorded_while_a_writer_is_installed():
    recorder = Recorder(STREAMS)
    installed: set[str] = set()
    recorder.follow(lambda: installed)
    writers = STREAMS["member_reads"].writers
    assert recorder.unobserved("collectives") is None  # written by the library's own ops
    reason = recorder.unobserved("member_reads")
    assert reason is not None and "make_call_method" in reason and "opaque_subclass.support()" in reason
    installed.add(writers[-1])
    assert recorder.recording("member_reads") and recorder.installed(writers[-1])


def test_the_library_s_streams_follow_its_state():
    on = {name: RECORDER.recording(name) for name in STREAMS}
    assert on["member_reads"] and on["traced_objects"] and on["collectives"]
    # torch 2.11 records subclass-made opaques (the backport), 2.12+ reads below Dynamo
    assert on["subclass_made_opaques"] == (not on["below_dynamo_reads"])
    with _library_off():
        assert not RECORDER.recording("member_reads") and RECORDER.recording("collectives")
    assert {name: RECORDER.recording(name) for name in STREAMS} == on


def test_records_are_kept_per_key_taken_once_and_die_with_the_key():
    recorder = Recorder(STREAMS)
    a, b = _Key(), _Key()
    recorder.add("member_reads", a, 1)
    recorder.add("member_reads", a, 2)
    recorder.add("member_reads", b, 3)
    recorder.add("below_dynamo_reads", a, (7, object, "size"))
    recorder.add("below_dynamo_reads", a, (7, object, "size"))
    recorder.add("below_dynamo_reads", a, (7, object, "ndim"))
    assert recorder.get("member_reads", a) == [1, 2]
    assert recorder.take("member_reads", a) == [1, 2] and recorder.take("member_reads", a) == []
    assert recorder.by_object("below_dynamo_reads", a) == {7: frozenset({"size", "ndim"})}
    recorder.put("traced_objects", b, 11, "held")
    assert recorder.lookup("traced_objects", b, 11) == "held" and recorder.lookup("traced_objects", a, 11) is None
    del b
    gc.collect()
    assert not recorder.has_any("traced_objects")


def test_collecting_blocks_see_what_runs_while_they_are_open():
    recorder = Recorder(STREAMS)
    outer_key, inner_key = _Key(), _Key()
    outer: list[object] = []
    inner: list[object] = []
    recorder.collecting("collectives", outer_key, outer)
    recorder.broadcast("collectives", "a")
    recorder.collecting("collectives", inner_key, inner)
    recorder.broadcast("collectives", "b")
    recorder.stop_collecting("collectives", inner_key)
    recorder.broadcast("collectives", "c")
    recorder.stop_collecting("collectives", outer_key)
    recorder.broadcast("collectives", "d")
    assert (outer, inner) == (["a", "b", "c"], ["b"])


def test_threads_record_without_losing_entries():
    recorder = Recorder(STREAMS)
    keys = [_Key() for _ in range(4)]
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        barrier.wait()
        for n in range(500):
            recorder.add("member_reads", keys[i % 4], (i, n))
            recorder.add("below_dynamo_reads", keys[i % 4], (n, object, f"m{i}"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(recorder.take("member_reads", k)) for k in keys) == 8 * 500
    assert all(len(recorder.by_object("below_dynamo_reads", k)) == 500 for k in keys)


@torch.library.custom_op("test_recorder::plus_one", mutates_args=())
def _plus_one(x: torch.Tensor, m: Mesh) -> torch.Tensor:
    return x + 1


@_plus_one.register_fake
def _(x: torch.Tensor, m: Mesh) -> torch.Tensor:
    return torch.empty_like(x)


def _checks(fn, *args) -> list[compile_passes.Finding]:
    seen: list[compile_passes.GraphCheck] = []
    backend = compile_passes.checking_backend("eager", on_finding="log", on_check=seen.append)
    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return [f for check in seen for f in check.findings]


def test_compile_passes_says_when_member_reads_are_not_recorded():
    """With the library's fixes off, Dynamo's reads of an opaque's members are
    not recorded: the checking backend reports OSC006 instead of an empty OSC004."""
    mesh = Mesh("m")

    def fn(x, m):
        return _plus_one(x, m)

    on = _checks(fn, torch.ones(2), mesh)
    assert [f.code for f in on if f.code == "OSC006"] == []
    with _library_off():
        off = _checks(fn, torch.ones(2), mesh)
    (finding,) = [f for f in off if f.code == "OSC006"]
    assert finding.severity == "info" and finding.path == "m"
    assert "members of opaques Dynamo read while tracing are not recorded" in finding.message
    assert "make_call_method" in finding.message and "opaque_subclass.enable()" in finding.fix


def test_member_reads_reach_the_lint_through_the_recorder():
    def fn(t):
        return t._data + t._gauge.offset

    findings = _checks(fn, GaugeTensor(torch.ones(1), Gauge(3, 4)))
    assert [f.code for f in findings if f.code in ("OSC004", "OSC006")] == ["OSC004"]


@pytest.mark.skipif(not RECORDER.recording("below_dynamo_reads"), reason="torch 2.11 records no position uses")
def test_share_compiles_refuses_what_it_cannot_observe(monkeypatch):
    """A torch where AOTAutograd's cache would hand a graph to every rank but
    no fix records the use of a rank's position: the pass refuses a graph with
    a mesh input, naming why, rather than share it unchecked."""
    pytest.importorskip("torch.distributed.device_mesh")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from opaque_subclass import dtensor

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = dist.device_mesh.init_device_mesh("cpu", (2,))
        graph = torch.fx.Graph()
        graph.placeholder("mesh").meta["val"] = mesh
        dtensor.refuse_rank_positions(graph)  # recorded, nothing used: shared
        assert RECORDER.installed(dtensor._MESH_KEYED_CACHE)
        without = frozenset(RECORDER._installed()) - set(STREAMS["position_uses"].writers)
        monkeypatch.setattr(RECORDER, "_installed", lambda: without)
        with pytest.raises(dtensor.ShareCompilesError, match="cannot tell whether this graph computes this rank"):
            dtensor.refuse_rank_positions(graph)
    finally:
        dist.destroy_process_group()
