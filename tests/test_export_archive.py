"""opaque_subclass.export.save / load: reference opaques stored by name, rebound at load."""

from __future__ import annotations

import io
import json
import os
import zipfile

import pytest
import torch
from subclasses import Config, HoldsMesh, Mesh, MeshTensor, Stream, nested

import opaque_subclass
import opaque_subclass.export as oexport
from opaque_subclass import OpaqueSubclass, OpaqueSubclassError
from opaque_subclass.testing import run_local_workers

DIST_WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_workers.py")
STRICT = pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])


class Sharded(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


class Scale(torch.nn.Module):
    def __init__(self, mesh, buffer_mesh=None):
        super().__init__()
        self.w = torch.nn.Parameter(Sharded(torch.arange(3.0), mesh))
        self.register_buffer("b", Sharded(torch.ones(3), buffer_mesh if buffer_mesh is not None else mesh))

    def forward(self, x):
        return self.w * x + self.b


class TwoParams(Scale):
    def forward(self, x):
        return self.w * x, self.b * x


class NestedParam(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(nested(2, "pq", torch.arange(6.0).reshape(2, 3)), requires_grad=False)

    def forward(self, x):
        return self.w * x


class Outer(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


class Tagged(OpaqueSubclass):
    """Metadata that may be None (as a replicated ShardedTensor's shard dim) and a value opaque."""

    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_tag", "_cfg")


class Unwrapped(torch.nn.Module):
    """Subclass parameters at one and two levels, for unwrap_subclass_parameters."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(Tagged(torch.arange(3.0), Mesh("w"), None, Config(2)))
        self.n = torch.nn.Parameter(
            Outer(Sharded(torch.arange(3.0) + 1, Mesh("inner-5e2a")), Mesh("outer")), requires_grad=False
        )

    def forward(self, x):
        return self.w * x, self.n * x, self.w


def _saved(ep, **kwargs):
    buf = io.BytesIO()
    manifest = oexport.save(ep, buf, **kwargs)
    buf.seek(0)
    return buf, manifest


def _archive_bytes(buf) -> bytes:
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return b"".join(z.read(n) for n in z.namelist())


@STRICT
def test_subclass_parameter_and_buffer_rebound_to_loader_mesh(strict):
    mesh = Mesh("saver-7f3a")
    model = Scale(mesh)
    x = torch.randn(3)
    ep = torch.export.export(model, (x,), strict=strict)
    buf, manifest = _saved(ep)
    assert manifest.names == ("w._mesh",)
    assert manifest.opaques[0].sites == ("state_dict['w']._mesh", "state_dict['b']._mesh")
    assert manifest.opaques[0].type_name == "subclasses.Mesh"
    assert ep.state_dict["w"]._mesh is mesh  # the caller's program is unchanged

    loader = Mesh("loader")
    loaded = oexport.load(buf, opaques={"w._mesh": loader})
    assert loaded.state_dict["w"]._mesh is loader and loaded.state_dict["b"]._mesh is loader
    assert isinstance(loaded.state_dict["w"], torch.nn.Parameter) and loaded.state_dict["w"].requires_grad
    out = loaded.module()(x)
    assert type(out) is Sharded and out._mesh is loader
    torch.testing.assert_close(out._data, model(x)._data)


def test_archive_never_holds_the_opaque_while_torch_save_pickles_it():
    ep = torch.export.export(Scale(Mesh("secret-4c1d9e")), (torch.randn(3),), strict=False)
    buf, _ = _saved(ep)
    assert b"secret-4c1d9e" not in _archive_bytes(buf)
    stock = io.BytesIO()
    if opaque_subclass.support().mode == "backport":  # torch 2.11: refused, with the way out
        with pytest.raises(
            TypeError,
            match=r"tensor 'w' holds the reference opaque 'w._mesh' \(subclasses.Mesh\).*Fix: `import opaque_subclass.export; opaque_subclass.export.save\(ep, f\)`",
        ):
            torch.export.save(ep, stock)
    else:  # native: torch's own save pickles the mesh by value (a documented limit)
        torch.export.save(ep, stock)
        assert b"secret-4c1d9e" in _archive_bytes(stock)


def test_distinct_opaques_get_distinct_names_and_shared_ones_one():
    a, b = Mesh("a"), Mesh("b")
    ep = torch.export.export(TwoParams(a, b), (torch.randn(3),), strict=False)
    buf, manifest = _saved(ep)
    assert manifest.names == ("w._mesh", "b._mesh")
    la, lb = Mesh("la"), Mesh("lb")
    loaded = oexport.load(buf, opaques={"w._mesh": la, "b._mesh": lb})
    assert loaded.state_dict["w"]._mesh is la and loaded.state_dict["b"]._mesh is lb


def test_nested_subclass_opaques_at_two_levels():
    model = NestedParam()
    x = torch.randn(2, 3)
    ep = torch.export.export(model, (x,), strict=False)
    buf, manifest = _saved(ep)
    assert manifest.names == ("w._data._mesh", "w._mesh")
    inner, outer = Mesh("inner"), Mesh("outer")
    loaded = oexport.load(buf, opaques={"w._data._mesh": inner, "w._mesh": outer})
    w = loaded.state_dict["w"]
    assert type(w) is MeshTensor and type(w._data) is MeshTensor
    assert w._mesh is outer and w._data._mesh is inner
    assert w._ctx == ("lvl", 1) and w._data._ctx == ("lvl", 0)  # contexts saved by value
    out = loaded.module()(x)
    assert out._mesh is outer
    torch.testing.assert_close(out._data._data, model(x)._data._data)


def test_user_names_and_resolver():
    mesh = Mesh("m")
    ep = torch.export.export(Scale(mesh), (torch.randn(3),), strict=False)
    buf, manifest = _saved(ep, opaques={"mesh": mesh})
    assert manifest.names == ("mesh",)
    assert oexport.read_manifest(buf) == manifest
    seen = []
    loader = Mesh("resolved")

    def resolve(name, cls):
        seen.append((name, cls))
        return loader

    loaded = oexport.load(buf, opaques=resolve)
    assert seen == [("mesh", Mesh)]
    assert loaded.state_dict["w"]._mesh is loader


def test_save_refuses_bad_names():
    mesh = Mesh("m")
    ep = torch.export.export(Scale(mesh), (torch.randn(3),), strict=False)
    with pytest.raises(
        ValueError,
        match=r"names \['other'\], which the program does not hold \(it holds: 'w._mesh' \(subclasses.Mesh\)\)",
    ):
        oexport.save(ep, io.BytesIO(), opaques={"other": Mesh("not in the program")})
    with pytest.raises(ValueError, match=r"is named both 'a' and 'b'"):
        oexport.save(ep, io.BytesIO(), opaques={"a": mesh, "b": mesh})
    with pytest.raises(ValueError, match="reserved for the manifest"):
        oexport.save(ep, io.BytesIO(), extra_files={oexport.MANIFEST_NAME: "x"})
    with pytest.raises(TypeError, match=r"expects a torch.export.ExportedProgram, got .*Scale"):
        oexport.save(Scale(mesh), io.BytesIO())


def test_two_objects_cannot_share_a_name():
    a, b = Mesh("a"), Mesh("b")
    ep = torch.export.export(TwoParams(a, b), (torch.randn(3),), strict=False)
    with pytest.raises(ValueError, match=r"the name 'w._mesh' would stand for two different objects"):
        oexport.save(ep, io.BytesIO(), opaques={"w._mesh": b})


def test_missing_wrong_and_unknown_names_list_everything_needed():
    ep = torch.export.export(TwoParams(Mesh("a"), Mesh("b")), (torch.randn(3),), strict=False)
    buf, _ = _saved(ep)
    with pytest.raises(oexport.OpaqueBindingError) as missing:
        oexport.load(buf, opaques={"w._mesh": Mesh()})
    message = str(missing.value)
    assert "no object for 'b._mesh'" in message
    assert "'w._mesh' (subclasses.Mesh) at state_dict['w']._mesh" in message
    assert "'b._mesh' (subclasses.Mesh) at state_dict['b']._mesh" in message
    assert (
        "Fix: pass this process's objects, opaque_subclass.export.load(f, opaques={'w._mesh': ..., 'b._mesh': ...})"
        in message
    )
    buf.seek(0)
    with pytest.raises(TypeError, match=r"'b._mesh' is a subclasses.Stream, not a subclasses.Mesh"):
        oexport.load(buf, opaques={"w._mesh": Mesh(), "b._mesh": Stream()})
    buf.seek(0)
    with pytest.raises(oexport.OpaqueBindingError, match=r"names the program does not have: 'typo'"):
        oexport.load(buf, opaques={"w._mesh": Mesh(), "b._mesh": Mesh(), "typo": Mesh()})
    buf.seek(0)
    with pytest.raises(TypeError, match=r"registered as a value opaque in this process"):
        oexport.load(buf, opaques={"w._mesh": Mesh(), "b._mesh": Config(4)})


def test_torch_load_alone_gives_placeholders_that_say_how_to_load():
    ep = torch.export.export(Scale(Mesh()), (torch.randn(3),), strict=False)
    buf, _ = _saved(ep)
    files = {oexport.MANIFEST_NAME: ""}
    plain = torch.export.load(buf, extra_files=files)  # torch's own tools open the archive
    assert json.loads(files[oexport.MANIFEST_NAME])["opaques"][0]["name"] == "w._mesh"
    with pytest.raises(
        OpaqueSubclassError,
        match=r"saved placeholder of .*Sharded at 'w'.*Fix: load it with `opaque_subclass.export.load",
    ):
        plain.module()(torch.randn(3))


def test_extra_files_round_trip():
    ep = torch.export.export(Scale(Mesh()), (torch.randn(3),), strict=False)
    buf, _ = _saved(ep, extra_files={"notes.txt": "hello"})
    files = {"notes.txt": ""}
    oexport.load(buf, opaques={"w._mesh": Mesh()}, extra_files=files)
    assert files == {"notes.txt": "hello"}


def test_program_without_opaques_round_trips_and_refuses_stray_names():
    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),), strict=False)
    buf, manifest = _saved(ep)
    assert manifest.names == ()
    loaded = oexport.load(buf)
    torch.testing.assert_close(loaded.module()(torch.ones(1, 2)), ep.module()(torch.ones(1, 2)))
    stock = io.BytesIO()
    torch.export.save(ep, stock)
    stock.seek(0)
    with pytest.raises(oexport.OpaqueBindingError, match="was not saved by opaque_subclass.export.save"):
        oexport.load(stock, opaques={"m": Mesh()})


def test_example_inputs_holding_opaques_are_not_saved():
    class Affine(torch.nn.Module):
        def forward(self, x):
            return x * 2 + 1

    ep = torch.export.export(Affine(), (Sharded(torch.ones(3), Mesh("example-0b7e")),), strict=False)
    buf, manifest = _saved(ep)
    assert manifest.names == () and manifest.example_inputs_dropped
    assert b"example-0b7e" not in _archive_bytes(buf)
    loaded = oexport.load(buf)
    assert loaded.example_inputs is None
    runtime = Sharded(torch.arange(3.0), Mesh("run"))
    assert loaded.module()(runtime)._mesh is runtime._mesh


def test_version_mismatch_is_named_when_torch_cannot_load(monkeypatch, tmp_path):
    ep = torch.export.export(Scale(Mesh()), (torch.randn(3),), strict=False)
    path = tmp_path / "old.pt2"
    oexport.save(ep, path)
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    name = next(n for n in members if n.endswith(oexport.MANIFEST_NAME))
    manifest = json.loads(members[name])
    manifest["torch"] = "2.0.0"
    members[name] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)

    def refuse(*args, **kwargs):
        raise RuntimeError("Serialized version 1.0 does not match our current schema version")

    monkeypatch.setattr(torch.export, "load", refuse)
    with pytest.raises(
        OpaqueSubclassError,
        match=r"torch .* cannot load the program in '.*old.pt2', saved with torch 2.0.0 \(RuntimeError: Serialized version.*Fix: load it with torch==2.0.0",
    ):
        oexport.load(path, opaques={"w._mesh": Mesh()})


def test_same_torch_failure_is_torch_own(monkeypatch):
    ep = torch.export.export(Scale(Mesh()), (torch.randn(3),), strict=False)
    buf, _ = _saved(ep)

    def refuse(*args, **kwargs):
        raise RuntimeError("corrupt archive")

    monkeypatch.setattr(torch.export, "load", refuse)
    with pytest.raises(RuntimeError, match="^corrupt archive$"):
        oexport.load(buf, opaques={"w._mesh": Mesh()})


@STRICT
def test_opaque_module_attribute_used_by_custom_op(strict):
    holder = HoldsMesh(Mesh("abcd"))
    ep = torch.export.export(holder, (torch.ones(2),), strict=strict)
    buf, manifest = _saved(ep, opaques={"mesh": holder.mesh})
    assert [(r.name, r.sites) for r in manifest.opaques] == [("mesh", ("constants['lifted_custom_0']",))]
    loader = Mesh("loader-mesh")
    loaded = oexport.load(buf, opaques={"mesh": loader})
    assert loaded.constants["lifted_custom_0"] is loader
    torch.testing.assert_close(loaded.module()(torch.ones(2)), torch.full((2,), 1.0 + len("loader-mesh")))


def test_direct_torch_save_of_a_lifted_reference_opaque(tmp_path):
    """torch 2.11 (backport): refused with a pointer to opaque_subclass.export.save;
    native releases pickle it, as torch does (a documented limit)."""
    ep = torch.export.export(HoldsMesh(Mesh("direct-91ac")), (torch.ones(2),), strict=False)
    if opaque_subclass.support().mode == "backport":
        with pytest.raises(
            TypeError,
            match=r"reference opaque constant 'lifted_custom_0' \(subclasses.Mesh\).*Fix: `import opaque_subclass.export; opaque_subclass.export.save\(ep, f\)`",
        ):
            torch.export.save(ep, tmp_path / "direct.pt2")
    else:
        torch.export.save(ep, tmp_path / "direct.pt2")
        with zipfile.ZipFile(tmp_path / "direct.pt2") as z:
            assert any(b"direct-91ac" in z.read(n) for n in z.namelist())


#: The archive's modes: torch.export's two tracers, and the weights unwrapped (rebuilt inside the
#: graph from plain tensors) before a non-strict export.
MODES = {
    "non-strict": {"strict": False, "unwrap": False},
    "strict": {"strict": True, "unwrap": False},
    "unwrapped": {"strict": False, "unwrap": True},
}


def test_sharded_model_saved_by_one_job_runs_on_another_jobs_process_group(tmp_path):
    """The real case: 2 gloo processes export a sharded MLP and save it; a new
    2-process job (another port, new groups, a new DeviceMesh) loads it and runs
    a forward whose collectives run on the new job's group. Every mode of
    :data:`MODES` in the same two jobs (each mode its own archive, and its own
    group in the second job): one launch of the ranks per job, not per mode."""
    payload = {"dir": str(tmp_path), "modes": MODES}
    saved = run_local_workers(f"{DIST_WORKERS}:export_every_mode", 2, payload=payload, timeout=300)
    manifest = {"names": ["mesh"], "types": ["torch.distributed.device_mesh.DeviceMesh"]}
    assert saved == [dict.fromkeys(MODES, manifest)] * 2, saved
    results = run_local_workers(f"{DIST_WORKERS}:load_every_mode", 2, payload=payload, timeout=300)
    for rank, by_mode in enumerate(results):
        assert list(by_mode) == list(MODES), by_mode
        for mode, r in by_mode.items():
            where = (rank, mode, r)
            assert r["params_hold_loader_mesh"] and r["output_mesh_is_loader_mesh"], where
            assert r["max_abs_error"] < 1e-5, where
            assert r["collectives"] == ["all_reduce_sum"], where  # the row-parallel layer's reduction
            assert all(r["on_new_group"]) and r["new_group_is_not_world"], where


@STRICT
def test_after_unwrap_tensor_subclass_parameters(strict):
    """The subclasses are rebuilt inside the graph (flat_apply of the constructor,
    whose specs torch's serializer refuses): saved as the library's op, restored
    at load, with the lifted meshes named after the parameters they rebuild."""
    model = opaque_subclass.unwrap_subclass_parameters(Unwrapped())
    x = torch.randn(3)
    ep = torch.export.export(model, (x,), strict=strict)
    assert any(n.target is torch.ops.higher_order.flat_apply for n in ep.graph.nodes)
    # torch alone fails on every release (2.11 first refuses the lifted meshes)
    stock = (
        "reference opaque constant"
        if opaque_subclass.support().mode == "backport"
        else "Failed serializing node flat_apply"
    )
    with pytest.raises(Exception, match=stock):
        torch.export.save(ep, io.BytesIO())
    buf, manifest = _saved(ep)
    assert manifest.names == ("w._mesh", "n._data._mesh", "n._mesh")
    assert [c.func for c in manifest.constructions] == [
        f"{__name__}.Tagged",
        f"{__name__}.Sharded",
        f"{__name__}.Outer",
        f"{__name__}.Tagged",
    ]
    assert b"inner-5e2a" not in _archive_bytes(buf)  # the meshes are stored by name only
    assert all(n.target is not torch.ops.opaque_subclass.stored_construction.default for n in ep.graph.nodes)

    w, inner, outer = Mesh("lw"), Mesh("linner"), Mesh("louter")
    loaded = oexport.load(buf, opaques={"w._mesh": w, "n._data._mesh": inner, "n._mesh": outer})
    got, ref = loaded.module()(x), model(x)
    assert type(got[0]) is Tagged and got[0]._mesh is w and got[0]._tag is None and got[0]._cfg == Config(2)
    assert type(got[1]) is Outer and got[1]._mesh is outer and got[1]._data._mesh is inner
    assert got[2]._mesh is w
    torch.testing.assert_close(got[0]._data, ref[0]._data)
    torch.testing.assert_close(got[1]._data._data, ref[1]._data._data)


def test_unwrapped_program_loaded_by_torch_alone_says_how_to_load():
    ep = torch.export.export(opaque_subclass.unwrap_subclass_parameters(Scale(Mesh())), (torch.randn(3),), strict=False)
    buf, manifest = _saved(ep)
    assert manifest.names == ("w._mesh",)  # w and b share one mesh, lifted once
    assert [c.args[-1] for c in manifest.constructions] == [("input", "parametrizations.w.0.lifted_custom_0")] * 2
    plain = torch.export.load(buf)
    with pytest.raises(
        OpaqueSubclassError,
        match=r"construction 'flat_apply\w*' .*loaded with torch.export.load.*Fix: load it with `opaque_subclass.export.load",
    ):
        plain.module()(torch.randn(3))


def test_unwrapped_program_needs_importable_subclasses():
    class Local(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(Local(torch.ones(2), Mesh()))

        def forward(self, x):
            return self.w * x

    ep = torch.export.export(opaque_subclass.unwrap_subclass_parameters(Holder()), (torch.ones(2),), strict=False)
    with pytest.raises(
        OpaqueSubclassError,
        match=r"calls <class '.*<locals>.Local'>, which a loading process cannot import by name. Fix: define the subclass at module level",
    ):
        oexport.save(ep, io.BytesIO())


def test_manifest_versions():
    record = {"name": "w._mesh", "type": "subclasses.Mesh", "sites": ["state_dict['w']._mesh"]}
    v1 = {
        "format": "opaque-subclass/export",
        "version": 1,
        "torch": "2.13.0",
        "opaque_subclass": "0.1.0",
        "opaques": [record],
    }
    manifest = oexport.ExportManifest.from_json(json.dumps(v1))  # written before constructions existed
    assert manifest.names == ("w._mesh",) and manifest.constructions == ()
    assert oexport.ExportManifest.from_json(manifest.to_json()) == manifest
    with pytest.raises(
        OpaqueSubclassError, match=r"saved by a newer opaque-subclass \(manifest version 3, this release reads 2\)"
    ):
        oexport.ExportManifest.from_json(json.dumps(dict(v1, version=3)))
    with pytest.raises(ValueError, match="not an opaque-subclass manifest"):
        oexport.ExportManifest.from_json(json.dumps(dict(v1, format="other")))
