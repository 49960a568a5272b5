"""torch's compile caches stay on and never serve a graph compiled for one
sharing of opaques to a call with another.

On native torch (2.12 - 2.15) AOTAutograd's cache key hashes an opaque by its
type, so it used to serve the graph compiled for ``x._mesh is y._mesh`` to a
call with distinct meshes (both outputs carried the first mesh). The native
fix (``opaque_subclass.fixes.autograd_cache``) keys the sharing
pattern. Each test uses its own fresh cache directory; no cache is turned off.
On torch 2.11 the backport's graphs are not affected: the same checks run there.

The second half covers ``OpaqueSubclass._stable_hash_for_caching``, the part of
AOTAutograd's cache key torch (2.12 - 2.15) asks a subclass input for: a program
compiled in one process is reused by a fresh one passing other opaque objects,
the hash changes with everything the program depends on and never with an
opaque's identity, and it is the same in every process. The children import
this module (``tests/`` is on their path) and print one JSON line.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import opaque_subclass as osc
from opaque_subclass import OpaqueBase, OpaqueSubclass
from opaque_subclass.releases import current
from opaque_subclass.testing import warm

ROOT = Path(__file__).resolve().parent.parent

# one worker runs the module: its children, one warm server per hash seed, start those servers once
pytestmark = pytest.mark.xdist_group("compile_cache")
CACHE_FIX = "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key"

# One process: a call with shared meshes, then one with distinct meshes; prints
# the outputs' meshes and the AOTAutograd cache counters (a line
# "cache hit=H miss=M bypass=B": each compilation counts once).
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
        two = torch.full((2,), 2.0)
        ok = o1._mesh is x._mesh and o2._mesh is y._mesh and torch.equal(o1._data, two) and torch.equal(o2._data, two)
        print(call, "OK" if ok else f"WRONG {o1._mesh} {o2._mesh}")
    aot = counters["aot_autograd"]
    print("cache", *(f"{k}={aot['autograd_cache_' + k]}" for k in ("hit", "miss", "bypass")))
    """
)


def _run(calls: str, cache_dir: Path, *flags: str) -> list[str]:
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }
    out = warm.run([sys.executable, "-c", _SCRIPT, calls, *flags], timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-5000:]
    return out.stdout.split("\n")


def test_cache_key_is_replaced_on_every_supported_release():
    # native: a fix of torch's bug; 2.11: keeps backport entries apart from stock torch's
    if osc.support().mode == "native":
        assert CACHE_FIX in osc.support().fixes
    else:
        assert CACHE_FIX in osc.support().patched


def test_across_processes_sharing_a_cache_dir(tmp_path):
    # The writer compiles only the shared case; the reader's *first* call has
    # distinct meshes and must not get the writer's graph. (One process calling
    # with shared, then distinct meshes, asking the cache and missing for the
    # second sharing rather than bypassing it: tests/test_devices.py's
    # test_compile_cache_reuses_a_program_only_for_its_sharing, on CPU in every leg.)
    lines = _run("shared", tmp_path)
    assert lines[:2] == ["shared OK", "cache hit=0 miss=1 bypass=0"], lines
    # The reader asked the cache and missed (neither a hit nor a bypass).
    lines = _run("distinct", tmp_path)
    assert lines[:2] == ["distinct OK", "cache hit=0 miss=1 bypass=0"], lines
    # The cache still works: the same sharing in a third process is a hit.
    lines = _run("shared", tmp_path)
    assert lines[:2] == ["shared OK", "cache hit=1 miss=0 bypass=0"], lines


@pytest.mark.skipif(osc.support().mode != "native", reason="the bug is native torch's")
def test_stock_torch_serves_the_wrong_mesh(tmp_path):
    """Negative control: with the library's patches and fixes removed, the bug is
    there on this release (when upstream fixes it, this fails: drop the fix)."""
    lines = _run("shared,distinct", tmp_path, "stock")
    # the wrong mesh comes from the cache: the second compilation was a hit
    assert lines[0] == "shared OK" and lines[1].startswith("distinct WRONG"), lines
    assert lines[2] == "cache hit=1 miss=1 bypass=0", lines


def test_no_opaque_keeps_torchs_key():
    from subclasses import Mesh, MeshTensor

    from opaque_subclass.fixes.autograd_cache import sharing_key

    assert sharing_key([torch.ones(2), 3]) is None
    m = Mesh("k")
    shared = sharing_key([MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), m)])
    distinct = sharing_key([MeshTensor(torch.ones(2), m), MeshTensor(torch.ones(2), Mesh("other"))])
    again = sharing_key([MeshTensor(torch.ones(2), Mesh("x")), MeshTensor(torch.ones(2), Mesh("y"))])
    assert shared != distinct and distinct == again  # the pattern, not the objects
    assert current().mode in ("native", "backport")


# ------------------------------------------------------- OpaqueSubclass._stable_hash_for_caching

NATIVE = osc.support().mode == "native"
WARNING = "does not implement _stable_hash_for_caching"


class CacheMesh(OpaqueBase):
    """A reference opaque standing in for a DeviceMesh."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"CacheMesh({self.name!r})"


osc.register_opaque(CacheMesh)


class CacheTensor(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": CacheMesh}
    meta_attrs = ("_tag",)


class TwinTensor(OpaqueSubclass):  # CacheTensor's declaration under another name
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": CacheMesh}
    meta_attrs = ("_tag",)


class NestedTensor(OpaqueSubclass):  # a CacheTensor inside
    tensor_attrs = ("_inner",)
    opaque_attrs = {"_mesh": CacheMesh}


def _static(t: torch.Tensor) -> torch.Tensor:
    return t * 2 + 1


def _dynamic(t: torch.Tensor) -> torch.Tensor:
    return t * 3 - 1


def _hashes() -> dict[str, str]:
    """The hashes the cross-process test compares (computed in each child)."""
    tags = frozenset(f"placement-{i}" for i in range(8))  # iteration order follows hash(str)
    return {
        "a": CacheTensor(torch.ones(2), CacheMesh("a"), "t")._stable_hash_for_caching(),
        "b": CacheTensor(torch.ones(2), CacheMesh("b"), "t")._stable_hash_for_caching(),
        "set": CacheTensor(torch.ones(2), CacheMesh("a"), tags)._stable_hash_for_caching(),
        "nested": NestedTensor(
            CacheTensor(torch.ones(2), CacheMesh("i"), "t"), CacheMesh("o")
        )._stable_hash_for_caching(),
        "set_order": ",".join(tags),
    }


def _child() -> None:
    """A child process: ``hash`` prints :func:`_hashes`; ``compile NAME SIZE
    [no-method] [unpicklable]`` calls a static and a dynamic-shape compiled
    program on ``CacheTensor``s holding ``CacheMesh(NAME)`` (and, with
    ``unpicklable``, a lambda as their ``_tag``) and prints, per program, the
    change of AOTAutograd's cache counters, whether the output carries this
    process's mesh, the exceptions the hash method raised, and the exception
    of each "Failed to pickle cache key" torch logged; plus how often torch asked
    for the hash and every warning or log record that names the method."""
    import logging
    import warnings

    from torch._dynamo.utils import counters

    if sys.argv[1] == "hash":
        _ = [object() for _ in range(int(os.environ["PYTHONHASHSEED"]) * 1000)]  # other id()s
        print(json.dumps(_hashes()))
        return
    name, size, *flags = sys.argv[2:]
    seen: list[str] = []
    pickle_failures: list[str] = []  # the exception of each failure to pickle a cache key

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    class KeepPickleFailures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "Failed to pickle cache key":
                error = record.exc_info[1] if record.exc_info else None  # logged while handling it
                pickle_failures.append(type(error).__qualname__ if error is not None else "no exception")

    for logger in (logging.getLogger(), logging.getLogger("torch")):
        logger.addHandler(Keep(logging.WARNING))
    # torch's cache-key pickler logs there; "torch._inductor" does not propagate to "torch"
    logging.getLogger("torch._inductor.codecache").addHandler(KeepPickleFailures(logging.WARNING))
    calls = [0]
    raised: list[str] = []  # what the method raised, each time
    if "no-method" in flags:  # stock torch's default hash
        del OpaqueSubclass._stable_hash_for_caching
    else:
        method = OpaqueSubclass._stable_hash_for_caching

        def counted(self: OpaqueSubclass) -> str:
            calls[0] += 1
            try:
                return method(self)
            except Exception as e:
                raised.append(type(e).__qualname__)
                raise

        OpaqueSubclass._stable_hash_for_caching = counted  # type: ignore[method-assign]
    report: dict[str, Any] = {"mode": osc.support().mode, "torch": torch.__version__}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for label, fn, n, dynamic in (("static", _static, 2, None), ("dynamic", _dynamic, int(size), True)):
            mesh = CacheMesh(name)
            tag: Any = (lambda: None) if "unpicklable" in flags else "t"
            before = dict(counters["aot_autograd"])
            n_raised, n_failures = len(raised), len(pickle_failures)
            out = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=dynamic)(
                CacheTensor(torch.ones(n), mesh, tag)
            )
            after = counters["aot_autograd"]
            report[label] = {
                "cache": {
                    k: after[f"autograd_cache_{k}"] - before.get(f"autograd_cache_{k}", 0)
                    for k in ("hit", "miss", "bypass", "saved")
                },
                "own_mesh": type(out) is CacheTensor and out._mesh is mesh,
                "values_ok": torch.equal(out._data, fn(torch.ones(n))),
                "raised": raised[n_raised:],
                "pickle_failures": pickle_failures[n_failures:],
            }
    report["asked"] = calls[0]
    report["warnings"] = [m for m in [str(w.message) for w in caught] + seen if "_stable_hash_for_caching" in m]
    print(json.dumps(report))


def _spawn(*args: str, cache_dir: Path, seed: str) -> dict[str, Any]:
    """Runs :func:`_child` with ``args`` in a fresh interpreter (its own
    ``PYTHONHASHSEED``) and returns the JSON line it printed."""
    env = {
        **os.environ,
        "PYTHONHASHSEED": seed,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
    }
    # One warm server per hash seed (the seed is read when an interpreter starts, so it is
    # part of a server's environment): each child is a fresh interpreter with that seed.
    out = warm.run(
        [sys.executable, "-c", "import test_compile_cache; test_compile_cache._child()", *args], timeout=300, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr[-5000:]
    if "no-method" not in args:
        assert WARNING not in out.stderr, out.stderr[-5000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# Changes of AOTAutograd's cache counters for one compiled program.
HIT = {"hit": 1, "miss": 0, "bypass": 0, "saved": 0}
SAVED = {"hit": 0, "miss": 1, "bypass": 0, "saved": 1}  # a miss: compiled, then saved
BYPASSED = {"hit": 0, "miss": 0, "bypass": 1, "saved": 0}


def test_a_fresh_process_reuses_the_program_with_its_own_mesh(tmp_path):
    """Process A compiles and saves; process B, with other meshes (and for
    the dynamic program another size), loads both programs from the cache,
    and its outputs carry its own mesh. torch asks for the hash, and nothing
    warns that the method is missing."""
    a = _spawn("compile", "a", "4", cache_dir=tmp_path, seed="1")
    b = _spawn("compile", "b", "6", cache_dir=tmp_path, seed="2")
    for report in (a, b):
        assert report["warnings"] == [], report
        for label in ("static", "dynamic"):
            assert report[label]["own_mesh"] and report[label]["values_ok"], report
    # torch 2.11 (backport) pickled each input's attributes into the key, the
    # opaque by value and the shards' data, so CacheMesh("b") missed; the
    # library's 2.11 key (stable_subclass_inputs) asks for the hash as the native
    # releases do, and every release loads both programs in process B.
    assert a["static"]["cache"] == SAVED and a["dynamic"]["cache"] == SAVED, a
    assert b["static"]["cache"] == HIT and b["dynamic"]["cache"] == HIT, b
    assert a["asked"] >= 2 and b["asked"] >= 2, (a, b)


@pytest.mark.skipif(
    not NATIVE,
    reason=f"torch {torch.__version__} (backport mode): torch never asks for the hash, so removing it changes "
    "nothing (test_a_fresh_process_reuses_the_program_with_its_own_mesh asserts it is never asked)",
)
def test_stock_torch_without_the_method(tmp_path):
    """Negative control: with the method deleted, torch hashes the flatten
    output itself. Measured on 2.12 - 2.15: it warns in every process, reuses
    the static program all the same, and bypasses its cache for the dynamic
    one (its default hash pickles the symbolic sizes and fails)."""
    a = _spawn("compile", "a", "4", "no-method", cache_dir=tmp_path, seed="1")
    b = _spawn("compile", "b", "6", "no-method", cache_dir=tmp_path, seed="2")
    for report in (a, b):
        assert report["asked"] == 0, report
        assert len(report["warnings"]) == 1 and report["warnings"][0].startswith("CacheTensor " + WARNING), report
        assert report["dynamic"]["cache"] == BYPASSED, report
        assert report["static"]["own_mesh"] and report["dynamic"]["own_mesh"], report
    assert a["static"]["cache"] == SAVED and b["static"]["cache"] == HIT, (a, b)


def test_the_hash_is_the_same_in_every_process(tmp_path):
    """Two interpreters with different hash seeds (and different id()s) compute
    the same hashes, including for a frozenset of strings in the context,
    whose iteration order does differ between them."""
    one = _spawn("hash", cache_dir=tmp_path, seed="1")
    two = _spawn("hash", cache_dir=tmp_path, seed="2")
    assert one.pop("set_order") != two.pop("set_order")  # the seeds do reorder the set
    assert one == two
    assert one["a"] == one["b"]  # the opaque object is not part of it


def _mesh_tensor(**overrides: Any) -> CacheTensor:
    values: dict[str, Any] = {"_data": torch.ones(2, 3), "_mesh": CacheMesh("m"), "_tag": "t"}
    values.update(overrides)
    return CacheTensor(**values)


def test_the_opaque_object_is_not_hashed():
    base = _mesh_tensor()._stable_hash_for_caching()
    assert isinstance(base, str) and len(base) == 32
    assert _mesh_tensor(_mesh=CacheMesh("other"))._stable_hash_for_caching() == base
    shared = CacheMesh("s")
    nested = NestedTensor(_mesh_tensor(_mesh=shared), shared)._stable_hash_for_caching()
    assert NestedTensor(_mesh_tensor(), CacheMesh("o"))._stable_hash_for_caching() == nested


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda: _mesh_tensor(_tag="u"), id="metadata"),
        pytest.param(lambda: _mesh_tensor(_tag=("t",)), id="metadata-type"),
        pytest.param(lambda: _mesh_tensor(_data=torch.ones(2, 3, dtype=torch.float64)), id="dtype"),
        pytest.param(lambda: _mesh_tensor(_data=torch.ones(3, 2)), id="shape"),
        pytest.param(lambda: _mesh_tensor(_data=torch.ones(3, 2).t()), id="stride"),
        pytest.param(
            lambda: CacheTensor(torch.ones(2, 3), CacheMesh("m"), "t", requires_grad=True), id="requires_grad"
        ),
        pytest.param(lambda: CacheTensor(torch.ones(2, 3), CacheMesh("m"), "t", outer_size=(4, 3)), id="outer-size"),
        pytest.param(lambda: TwinTensor(torch.ones(2, 3), CacheMesh("m"), "t"), id="class"),
    ],
)
def test_the_hash_changes_with_what_the_program_depends_on(other):
    assert other()._stable_hash_for_caching() != _mesh_tensor()._stable_hash_for_caching()


def test_the_hash_changes_with_a_nested_subclass_and_the_library_version(monkeypatch):
    inner = NestedTensor(_mesh_tensor(), CacheMesh("o"))._stable_hash_for_caching()
    assert NestedTensor(_mesh_tensor(_tag="u"), CacheMesh("o"))._stable_hash_for_caching() != inner
    base = _mesh_tensor()._stable_hash_for_caching()
    monkeypatch.setattr("opaque_subclass.core.stable_hash.LIBRARY_VERSION", "0.0.0-other")
    assert _mesh_tensor()._stable_hash_for_caching() != base


def _check_unpicklable_context_bypassed(report: dict[str, Any]) -> None:
    """A child's report (``compile NAME SIZE unpicklable``) shows that torch
    bypassed AOTAutograd's cache for both programs, because of the context,
    and still ran them right. Measured: on 2.12 - 2.15 torch asks for the hash
    once per program, the method raises ``PicklingError`` each time, and torch's
    cache-key pickler logs "Failed to pickle cache key" caused by it, then
    counts a bypass. On 2.11 the library's key asks for the hash the same way
    (``opaque_subclass.fixes.autograd_cache.stable_subclass_inputs``), before
    torch's pickler runs (nothing logged as a pickling failure), and torch
    bypasses on the exception."""
    for label in ("static", "dynamic"):
        program = report[label]
        assert program["cache"] == BYPASSED, (label, report)
        assert program["own_mesh"] and program["values_ok"], (label, report)
        assert program["raised"] == ["PicklingError"], (label, report)
    assert report["asked"] == 2, report
    failures = ["PicklingError"] if report["mode"] == "native" else []
    for label in ("static", "dynamic"):
        assert report[label]["pickle_failures"] == failures, (label, report)


def test_an_unpicklable_context_raises_so_torch_bypasses(tmp_path):
    """A context that cannot be pickled: the hash raises ``PicklingError`` (the
    one exception, on every release: Python's pickle refuses a lambda), and
    torch bypasses AOTAutograd's cache for the program instead of failing."""
    with pytest.raises(pickle.PicklingError, match=r"Can't pickle <function .*<lambda>") as info:
        _mesh_tensor(_tag=lambda: None)._stable_hash_for_caching()
    assert type(info.value) is pickle.PicklingError
    report = _spawn("compile", "a", "4", "unpicklable", cache_dir=tmp_path, seed="1")
    assert report["mode"] == osc.support().mode and report["warnings"] == [], report
    _check_unpicklable_context_bypassed(report)


def test_the_bypass_check_refuses_a_cache_that_was_not_bypassed():
    """:func:`_check_unpicklable_context_bypassed` accepts the report of this
    release and refuses: a program that was compiled and saved (not bypassed),
    one that hit, a bypass without the method's exception (native: for another
    reason than the context), and a wrong output."""
    native = osc.support().mode == "native"

    def program(cache: dict[str, int], raised: list[str], failures: list[str]) -> dict[str, Any]:
        return {"cache": cache, "own_mesh": True, "values_ok": True, "raised": raised, "pickle_failures": failures}

    def report(**changes: Any) -> dict[str, Any]:
        failures = ["PicklingError"] if native else []
        static = dynamic = program(BYPASSED, ["PicklingError"], failures)
        right = {"mode": osc.support().mode, "static": static, "dynamic": dynamic, "asked": 2}
        for label, fields in changes.items():
            right[label] = {**right[label], **fields}
        return right

    _check_unpicklable_context_bypassed(report())
    for wrong in (
        report(static={"cache": SAVED}),
        report(dynamic={"cache": HIT}),
        report(static={"raised": [], "pickle_failures": []}),
        report(static={"pickle_failures": ["RuntimeError"]}),
        report(dynamic={"own_mesh": False}),
    ):
        with pytest.raises(AssertionError):
            _check_unpicklable_context_bypassed(wrong)
