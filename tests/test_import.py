"""What importing the library does, and does not do, to a fresh process.

* It imports none of Dynamo, AOTAutograd's caches, inductor or export: a patch
  (backport, torch 2.11) or fix (native releases) whose torch module is not
  imported yet is checked against the module's source file and applied when
  torch imports the module; ``disable()`` removes those too.
* It registers torch's ``ProcessGroup`` and ``DeviceMesh`` (as torch registers
  them, at one moment on every release) and nothing else; it defines no custom
  op (``opaque_subclass.sharded`` and ``opaque_subclass.sharded.collectives``
  included): the first ``ShardedTensor`` collective does.
* Unpickling what a patched process wrote (AOTAutograd cache entries on torch
  2.11) never imports, so never enables, the library.

Each case runs in a fresh interpreter: the test process has long imported
everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import opaque_subclass as osc

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, tmp_path: Path, timeout: int = 300, prelude: str = "") -> dict:
    """Run ``code`` in a fresh interpreter (this checkout first on the path, its
    own inductor cache); it prints one JSON object last."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(tmp_path), env.get("PYTHONPATH", "")])
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-cache")
    out = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_REGISTRY_SNAPSHOT = """
def registered():
    import torch._library.opaque_object as oo
    return sorted(getattr(c, "__qualname__", str(c)) for c in getattr(oo, "_OPAQUE_TYPES", {}))
"""


def test_import_loads_no_compiler_and_registers_only_torchs_distributed_classes(tmp_path):
    got = _run(
        """
        import json, sys, torch
        import torch.distributed.device_mesh
        before = registered()
        loaded = set(sys.modules)
        import opaque_subclass, opaque_subclass.sharded.collectives, opaque_subclass.sharded
        after = registered()
        s = opaque_subclass.support()
        print(json.dumps({
            "mode": s.mode,
            "before": before, "after": after,
            "heavy": sorted(m for m in ("torch._dynamo", "torch._inductor", "torch.export", "torch.distributed.tensor",
                                        "torch._functorch._aot_autograd.autograd_cache")
                            if m in sys.modules and m not in loaded),
            "ops": hasattr(torch.ops.opaque_subclass, "all_gather"),
            "listed": len(s.patched) + len(s.fixes),
        }))
        """,
        tmp_path,
        prelude=_REGISTRY_SNAPSHOT,
    )
    assert got["mode"] == osc.support().mode
    # torch's own ProcessGroup and DeviceMesh only, registered at one moment on
    # every release (torch registers them at moments that differ by release)
    assert got["after"] == sorted({*got["before"], "DeviceMesh", "ProcessGroup"}), "importing the library registered"
    assert got["heavy"] == [], "importing the library imported these torch subsystems"
    assert got["ops"] is False
    assert got["listed"] == len(osc.support().patched) + len(osc.support().fixes) > 0


def test_waiting_patches_apply_on_import_and_disable_removes_them(tmp_path):
    got = _run(
        """
        import importlib, json, sys
        import opaque_subclass
        from opaque_subclass import activation
        from opaque_subclass.patching import _locate, _raw, _resolve, _function, fingerprint
        ps = activation.BACKPORT or activation.FIXES
        waiting = list(ps.waiting)
        target = waiting[0]
        module = _locate(target)[0]
        was_imported = module in sys.modules
        hooked = any(type(f).__name__ == "_ImportHook" for f in sys.meta_path)
        importlib.import_module(module)
        now = _raw(*_resolve(target)[:2])
        record = next(a for a in ps._applied if a.patch.target == target)
        applied = now is record.replacement and target not in ps.waiting
        original = record.original
        opaque_subclass.disable()
        restored = _raw(*_resolve(target)[:2]) is original
        unhooked = not any(type(f).__name__ == "_ImportHook" for f in sys.meta_path)
        opaque_subclass.enable()
        reapplied = _raw(*_resolve(target)[:2]) is not original
        print(json.dumps({"waiting": waiting, "was_imported": was_imported, "hooked": hooked, "applied": applied,
                          "restored": restored, "unhooked": unhooked, "reapplied": reapplied}))
        """,
        tmp_path,
    )
    assert got["waiting"], "every patch was applied at import: the library imported its targets' modules"
    assert got["was_imported"] is False and got["hooked"] is True
    assert got["applied"] is True
    assert got["restored"] is True and got["unhooked"] is True
    assert got["reapplied"] is True


def test_a_set_removed_on_a_failed_import_makes_support_tell_and_the_cli_exit_1(tmp_path):
    """A patch waiting for its module that fails to apply when torch imports
    the module removes the whole set; ``support()`` then says so
    (``problem``; a removed backport is ``mode="unsupported"``) and
    ``python -m opaque_subclass`` exits 1 instead of reporting the set as on."""
    got = _run(
        """
        import contextlib, dataclasses, importlib, io, json, warnings
        import opaque_subclass
        from opaque_subclass import activation, cli
        from opaque_subclass.patching import _locate
        ps = activation.BACKPORT or activation.FIXES
        before = opaque_subclass.support()
        target = ps.waiting[0]  # its module imports on its own (the first test above imports it too)
        module = _locate(target)[0]

        def broken(original):
            raise RuntimeError("a replacement that cannot be built")

        # the test's own stand-in for one waiting row, in the set's private list
        patches = ps._deferred[module]
        index = next(i for i, p in enumerate(patches) if p.target == target)
        patches[index] = dataclasses.replace(patches[index], make=broken)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            importlib.import_module(module)
        after = opaque_subclass.support()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["--no-demo"])
        print(json.dumps({"before": [before.mode, before.problem], "mode": after.mode, "problem": after.problem,
                          "patched": len(after.patched), "fixes": len(after.fixes), "enabled": ps.enabled,
                          "warned": any("every patch of the set is removed" in str(w.message) for w in caught),
                          "code": code, "printed": out.getvalue()}))
        """,
        tmp_path,
    )
    assert got["before"][1] is None
    assert got["enabled"] is False and got["warned"] is True
    assert got["patched"] == 0 and got["fixes"] == 0
    assert "a replacement that cannot be built" in got["problem"]
    assert got["mode"] == ("unsupported" if got["before"][0] == "backport" else "native")
    assert got["code"] == 1 and "problem" in got["printed"]


def test_support_read_while_another_thread_removes_the_set_is_before_or_after(tmp_path):
    """The import hook removes a set on the thread that imported the module;
    ``support()`` read meanwhile from another thread is one value: the one before
    the removal or the one after it, never a mix (the set already off while
    ``support()`` still lists it without a problem, or lists nothing without one).
    The removal is slowed down between its steps to make the window wide."""
    got = _run(
        """
        import dataclasses, importlib, json, threading, time, warnings
        import opaque_subclass
        from opaque_subclass import activation
        from opaque_subclass.patching import _locate
        ps = activation.BACKPORT or activation.FIXES
        before = opaque_subclass.support()
        target = ps.waiting[0]
        module = _locate(target)[0]
        patches = ps._deferred[module]
        index = next(i for i, p in enumerate(patches) if p.target == target)

        def broken(original):
            raise RuntimeError("a replacement that cannot be built")

        patches[index] = dataclasses.replace(patches[index], make=broken)
        real = ps._disable_locked

        def slow_disable():  # the test's own: every step of the removal takes its time
            time.sleep(0.3)
            real()
            time.sleep(0.3)

        ps._disable_locked = slow_disable
        seen, done = set(), threading.Event()

        def watch():
            while not done.is_set():
                seen.add(opaque_subclass.support())

        watcher = threading.Thread(target=watch)
        watcher.start()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            worker = threading.Thread(target=importlib.import_module, args=(module,))
            worker.start()
            worker.join()
        time.sleep(0.1)
        done.set()
        watcher.join()
        after = opaque_subclass.support()
        odd = [dataclasses.astuple(s) for s in seen - {before, after}]
        print(json.dumps({"odd": odd, "changed": after != before, "problem": after.problem, "states": len(seen)}))
        """,
        tmp_path,
    )
    assert got["changed"] is True and "a replacement that cannot be built" in got["problem"]
    assert got["odd"] == [], got["odd"]


def test_a_changed_source_refuses_the_set_before_its_module_is_imported(tmp_path):
    got = _run(
        """
        import json, sys
        import torch
        from opaque_subclass.patching import Patch, PatchRefused, PatchSet, source_fingerprint
        target = "torch._functorch.partitioners.default_partition"
        real = source_fingerprint("torch._functorch.partitioners", ("default_partition",))
        good = PatchSet([Patch(target, real, lambda f: f)])
        stale = PatchSet([Patch(target, "0" * 16, lambda f: f)])
        problems = stale.check()
        try:
            stale.enable()
            refused = False
        except PatchRefused:
            refused = True
        imported_after_refusal = "torch._functorch.partitioners" in sys.modules
        other_target = "torch._functorch.partitioners.min_cut_rematerialization_partition"
        other_real = source_fingerprint("torch._functorch.partitioners", ("min_cut_rematerialization_partition",))
        other = PatchSet([Patch(other_target, other_real, lambda f: f)])  # a second set waiting for the same module
        good.enable()
        other.enable()
        waiting = list(good.waiting)
        import torch._functorch.partitioners as p
        applied = not good.waiting and p.default_partition is good._applied[0].replacement
        applied = applied and not other.waiting and p.min_cut_rematerialization_partition is other._applied[0].replacement
        good.disable()
        other.disable()
        print(json.dumps({"problems": problems, "refused": refused, "imported": imported_after_refusal,
                          "waiting": waiting, "applied": applied}))
        """,
        tmp_path,
    )
    assert got["refused"] is True and "expected 0000000000000000" in got["problems"][0]
    assert got["imported"] is False
    assert got["waiting"] == ["torch._functorch.partitioners.default_partition"]
    assert got["applied"] is True


def test_the_recorded_sources_are_this_torchs():
    """The release row's ``sources`` are what ``tools/record_sources.py``
    records on this torch: a patch added or a fingerprint changed without
    recording again fails here (and, at import, only costs the parsing)."""
    from opaque_subclass.patching import record_sources
    from opaque_subclass.releases import current

    row = current()
    patches = row.patches or row.fixes
    assert patches, "a supported release without patches or fixes"
    assert row.sources == record_sources(patches), (
        f"stale entry {row.label!r} in opaque_subclass/releases/sources.json: "
        "run `python tools/record_sources.py` with this torch"
    )


def test_every_release_with_patches_reads_its_recorded_sources():
    """Each row with patches or fixes takes its ``sources`` from its own entry of
    ``releases/sources.json`` (written by ``tools/record_sources.py``), which the
    package ships as data."""
    import importlib.resources

    from opaque_subclass.releases import RELEASES
    from opaque_subclass.releases.sources import FILE, recorded_sources

    assert importlib.resources.files("opaque_subclass.releases").joinpath(FILE).is_file()
    for release, row in RELEASES.items():
        if row.patches or row.fixes:
            assert row.sources, f"torch {row.label}: nothing recorded in releases/sources.json"
            assert row.sources == recorded_sources(release), f"releases/v2_{release[1]}.py reads another entry"
            assert row.sources[0][0] == "<fingerprints>"


def test_record_sources_writes_one_entry_and_keeps_the_others():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import record_sources
    finally:
        sys.path.remove(str(ROOT / "tools"))
    text = (ROOT / "opaque_subclass" / "releases" / "sources.json").read_text(encoding="utf-8")
    table = json.loads(text)
    entry = table["2.13"]
    assert record_sources.updated(table, "2.13", entry["torch"], tuple(entry["files"].items())) == text
    added = json.loads(record_sources.updated(table, "2.9", "2.9.0", (("<fingerprints>", "0" * 16),)))
    assert [k for k in added if k[0].isdigit()] == ["2.9", *(k for k in table if k[0].isdigit())]
    assert {k: v for k, v in added.items() if k != "2.9"} == table


def test_import_parses_no_torch_source_while_the_recorded_files_are_unchanged(tmp_path):
    """Enabling hashes the recorded files instead of parsing them; the same set
    with one recorded digest changed, or with another fingerprint, parses them
    and reaches the same verdict (or refuses a wrong fingerprint)."""
    got = _run(
        """
        import dataclasses, json
        import opaque_subclass
        from opaque_subclass import activation, patching
        ps = activation.BACKPORT or activation.FIXES
        fast = {"parsed": patching._parsed.cache_info().misses, "waiting": sorted(ps.waiting)}
        opaque_subclass.disable()  # the imported targets are checked on torch's own functions
        (marker, first), *files = ps.sources
        changed = patching.PatchSet(ps.patches, ((marker, first), *files[:-1], (files[-1][0], "0" * 16)))
        problems, waits, _, _ = changed._examine()
        slow = {"parsed": patching._parsed.cache_info().misses, "problems": problems, "waits": sorted(waits)}
        i = next(i for i, p in enumerate(ps.patches) if p.target in waits)
        wrong = list(ps.patches)
        wrong[i] = dataclasses.replace(wrong[i], fingerprint="0" * 16)
        refused = patching.PatchSet(wrong, ps.sources).check()
        print(json.dumps({"fast": fast, "slow": slow, "refused": refused, "target": wrong[i].target}))
        """,
        tmp_path,
    )
    assert got["fast"]["waiting"], "nothing waits: the check below would prove nothing"
    assert got["fast"]["parsed"] == 0
    assert got["slow"]["parsed"] > 0 and got["slow"]["problems"] == []
    assert got["slow"]["waits"] == got["fast"]["waiting"]
    (refusal,) = got["refused"]
    assert refusal.startswith(f"{got['target']}: source fingerprint ") and refusal.endswith(
        ", expected 0000000000000000"
    )


def test_source_fingerprints_match_the_imported_definitions():
    """For every target (and dependency) of this release's set, the fingerprint
    read from the source file equals the one of the imported object."""
    from opaque_subclass import activation
    from opaque_subclass.patching import _locate, source_fingerprint

    ps = activation.BACKPORT or activation.FIXES
    assert ps is not None
    compared = 0
    for p in ps.patches:
        for target, expected in p.fingerprinted:
            located = _locate(target)
            assert located is not None, target
            assert source_fingerprint(*located) == expected, target
            compared += 1
    assert compared >= len(ps.patches)


def test_fingerprint_of_a_method_dataclass_wrote(tmp_path, monkeypatch):
    """A ``__repr__`` that ``@dataclass`` wrote has no source: its fingerprint is the class's,
    the same read from the file and from the object, and changes with the class (a new field);
    a ``__repr__`` the class defines, or one ``repr=False`` leaves to ``object``, is not one."""
    import importlib

    from opaque_subclass import patching
    from opaque_subclass.patching import _dataclass_generated, attribute_fingerprint, source_fingerprint

    torch_file = patching._module_file  # torch's files only; these modules are beside the test
    monkeypatch.setattr(
        patching,
        "_module_file",
        lambda name: str(tmp_path / f"{name}.py") if name.startswith("dc_") else torch_file(name),
    )

    def load(name: str, fields: str) -> Any:
        (tmp_path / f"{name}.py").write_text(
            "import dataclasses\nfrom dataclasses import dataclass\n\n\n"
            f"@dataclass\nclass Meta:\n{fields}\n\n"
            "@dataclasses.dataclass(repr=False)\nclass Quiet:\n    a: int\n\n\n"
            "@dataclass\nclass Own:\n    a: int\n\n    def __repr__(self):\n        return 'own'\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        return importlib.import_module(name)

    first = load("dc_first", "    a: int\n")
    second = load("dc_second", "    a: int\n    b: int = 0\n")
    assert _dataclass_generated(first.Meta, "__repr__")
    assert not _dataclass_generated(first.Quiet, "__repr__") and not _dataclass_generated(first.Own, "__repr__")
    for module in (first, second):
        for cls in ("Meta", "Own"):
            assert source_fingerprint(module.__name__, (cls, "__repr__")) == attribute_fingerprint(
                getattr(module, cls), "__repr__"
            ), cls
    assert attribute_fingerprint(first.Meta, "__repr__") != attribute_fingerprint(second.Meta, "__repr__")
    assert source_fingerprint("dc_first", ("Quiet", "__repr__")) != source_fingerprint("dc_first", ("Meta", "__repr__"))


_PLAIN_MODULE = textwrap.dedent(
    """
    import torch
    from torch.utils._pytree import tree_map_only


    class Mesh:
        pass


    class MeshTensor(torch.Tensor):
        @staticmethod
        def __new__(cls, data, mesh):
            return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

        def __init__(self, data, mesh):
            self._data, self._mesh = data, mesh

        def __repr__(self):
            return "MeshTensor()"

        def __tensor_flatten__(self):
            return ["_data", "_mesh"], None

        @staticmethod
        def __tensor_unflatten__(inner, ctx, size, stride):
            return MeshTensor(inner["_data"], inner["_mesh"])

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            mesh = next(a for a in args if isinstance(a, MeshTensor))._mesh
            out = func(*tree_map_only(MeshTensor, lambda t: t._data, args), **(kwargs or {}))
            return tree_map_only(torch.Tensor, lambda t: MeshTensor(t, mesh), out)
    """
)


def test_unpickling_library_objects_never_enables_it(tmp_path):
    """What the backport puts in AOTAutograd cache entries (torch 2.11), and on a
    2.11 leg a real entry written by a patched process, load in a process that
    never imported the library without importing it."""
    (tmp_path / "plainmod.py").write_text(_PLAIN_MODULE)
    writer = _run(
        """
        import base64, json, pickle, torch
        import opaque_subclass
        from _opaque_subclass_pickle import OpaqueSlotMeta
        blobs = [base64.b64encode(pickle.dumps(OpaqueSlotMeta(3, memory_format=None))).decode()]
        if opaque_subclass.support().mode == "backport":
            from plainmod import Mesh, MeshTensor  # a user module that does not import the library
            opaque_subclass.register_opaque(Mesh)
            f = torch.compile(lambda x: x * 2, backend="inductor", fullgraph=True)
            m = Mesh()
            assert f(MeshTensor(torch.ones(2), m))._mesh is m
        print(json.dumps({"blobs": blobs}))
        """,
        tmp_path,
    )
    reader = _run(
        """
        import base64, json, os, pickle, sys
        import torch
        blobs = %r
        loaded = [type(pickle.loads(base64.b64decode(b))).__name__ for b in blobs]
        entries = 0
        root = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "aotautograd")
        for dirpath, _, files in os.walk(root):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    data = fh.read()
                if b"OpaqueSlotMeta" in data:
                    pickle.loads(data)
                    entries += 1
        print(json.dumps({"loaded": loaded, "entries": entries, "library": "opaque_subclass" in sys.modules}))
        """
        % (writer["blobs"],),
        tmp_path,
    )
    assert reader["loaded"] == ["OpaqueSlotMeta"]
    if osc.support().mode == "backport":
        assert reader["entries"] >= 1
    assert reader["library"] is False


def test_sharded_tensor_on_first_use(tmp_path):
    got = _run(
        """
        import json, os, torch
        import torch.distributed as dist
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            from torch.distributed.device_mesh import init_device_mesh, DeviceMesh
            from opaque_subclass.core.registry import opaque_kind
            import opaque_subclass
            from opaque_subclass.sharded import ShardedTensor
            mesh = init_device_mesh("cpu", (1,))
            before = opaque_kind(DeviceMesh)
            x = ShardedTensor.from_full(torch.arange(4.0), mesh, 0)
            kind = opaque_kind(DeviceMesh)
            f = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
            y = f(x)
            from opaque_subclass.sharded.collectives import all_gather
            ok = y.mesh is mesh and torch.equal(y._local, torch.arange(4.0) * 2)
            print(json.dumps({"before": before, "kind": kind, "ok": ok, "op": hasattr(torch.ops.opaque_subclass, "all_gather")}))
        finally:
            dist.destroy_process_group()
        """,
        tmp_path,
        prelude=_REGISTRY_SNAPSHOT,
    )
    assert got["before"] == "reference"  # import opaque_subclass registered it, on every release
    assert got["kind"] == "reference"
    assert got["ok"] is True and got["op"] is True
