"""The backport machinery and each torch 2.11 patch.

Mode-independent tests exercise PatchSet on stand-in functions; the others run
in backport mode (torch 2.11) and show, for every patch, a scenario that fails
when just that patch is suspended.
"""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Callable

import pytest
import torch
import torch._inductor.exc
from scenarios import (
    ANOTHER_GROUPS_ENTRY_FAILURE,
    ANSWERING_OPAQUE_FAILURE,
    COLLECTIVE_GROUP_TYPE_FAILURE,
    DELETED_LEAF_FAILURE,
    DTENSOR_MESH_CONSTANT_FAILURE,
    ENTRY_GUARD_UNREAD_FAILURE,
    FLATTEN_GUARDED_PER_INPUT_FAILURE,
    GENERIC_GRADIENT_WALK_FAILURE,
    LIBRARY_ERROR_WRAPPED_FAILURE,
    LOAD_CONSTANT_FAILURE,
    MALFORMED_NAMES_FAILURE,
    MEMBER_UNGUARDED_FAILURE,
    MESH_RECOMPILED_FAILURE,
    SAVE_CONSTANT_FAILURE,
    SAVED_OPAQUE_CHECK_FAILURE,
    SAVED_VALUES_WALK_FAILURE,
    TANGENT_LIST_FAILURE,
    UNDECLARED_MEMBER_FAILURE,
    WRONG_UNFLATTEN_EXPORTED,
    StockFailure,
    assert_fails_as,
    backward_refuses_a_tangent_listing_other_attributes,
    collectives_on_group_attribute_compile_per_group,
    compile_raises_the_librarys_error,
    compile_takes_an_opaque_answering_every_name,
    constant_flatten_guarded_once_per_class,
    direct_save_of_subclass_parameter_is_refused,
    dtensor_handlers_take_registered_mesh,
    dtensor_outputs_on_runtime_mesh,
    export_names_a_wrong_unflatten,
    export_names_malformed_flatten_names,
    fresh_inductor_cache,
    fsdp1_module_state_sync_keeps_opaques,
    gradients_rebuilt_by_generated_code,
    inductor_metrics_log_on,
    member_method_result_is_guarded,
    meshes_of_one_shape_compile_once,
    no_rank_loads_another_groups_entry,
    parametrization_names_a_deleted_opaque_leaf,
    program_on_groups_compiles_once,
    save_and_load_opaque_constant,
    saved_opaques_checked_once_per_class,
    saved_values_passed_without_a_walk,
    storage_accounting_skips_opaques,
    torch_subclass_parametrization_keeps_opaques,
    undeclared_member_is_named,
)
from subclasses import BareMeshTensor, Mesh, MeshTensor, add_name_length, registered_mesh_world_of_one
from upstream_scenarios import (
    DTENSOR_MESH_CONSTANT_CACHE_FAILURE,
    DTENSOR_MESH_CONSTANT_LOWERING_FAILURE,
    MADE_WHILE_TRACING_FAILURE,
    UNTRACED_FUNCTION_FAILURE,
    checkpointed_untraced_function_is_not_served_stale,
    dtensor_made_on_a_mesh_argument_compiles_with_inductor,
    reference_opaque_made_while_tracing_is_named,
)

import opaque_subclass
from opaque_subclass.patching import Patch, PatchRefused, PatchSet, fingerprint
from opaque_subclass.testing import warm

BACKPORT = opaque_subclass.support().mode == "backport"
needs_backport = pytest.mark.skipif(not BACKPORT, reason="backport mode only (torch 2.11)")


# --------------------------------------------------------------------------- machinery


@pytest.fixture
def dummy_module():
    import linecache

    name = "torch._opaque_subclass_test_dummy"
    source = textwrap.dedent(
        """
        def double(x):
            return 2 * x

        def triple(x):
            return 3 * x

        class Box:
            def size(self):
                return 1
        """
    )
    # Compiled under a linecache-backed file name so that inspect.getsource works.
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    mod = types.ModuleType(name)
    exec(compile(source, filename, "exec"), mod.__dict__)
    alias = types.ModuleType(name + "_alias")
    alias.double = mod.double  # like `from .dummy import double`
    sys.modules[name] = mod
    sys.modules[alias.__name__] = alias
    yield mod, alias
    del sys.modules[name], sys.modules[alias.__name__]


def _plus_one(original):
    """Adds one to the result."""
    return lambda *a: original(*a) + 1


def test_patch_set_replaces_aliases_and_restores_exactly(dummy_module):
    mod, alias = dummy_module
    orig_double, orig_size = mod.double, mod.Box.size
    ps = PatchSet(
        [
            Patch(f"{mod.__name__}.double", fingerprint(mod.double), _plus_one),
            Patch(f"{mod.__name__}.Box.size", fingerprint(mod.Box.size), _plus_one),
        ]
    )
    assert ps.enable() == (f"{mod.__name__}.double", f"{mod.__name__}.Box.size")
    assert mod.double(2) == 5 and alias.double(2) == 5 and mod.Box().size() == 2
    assert ps.enable() == ps.targets  # idempotent
    with ps.suspended(f"{mod.__name__}.double"):
        assert mod.double(2) == 4 and alias.double(2) == 4
    assert mod.double(2) == 5
    ps.disable()
    ps.disable()  # idempotent
    assert mod.double is orig_double and alias.double is orig_double
    assert mod.Box.__dict__["size"] is orig_size
    assert not ps.enabled and ps.targets == ()


def test_disable_restores_modules_imported_while_enabled(dummy_module):
    """A torch module imported after enable() takes the replacement by name;
    disable() puts the original back there too."""
    mod, alias = dummy_module
    orig = mod.double
    ps = PatchSet([Patch(f"{mod.__name__}.double", fingerprint(orig), _plus_one)])
    ps.enable()
    late = types.ModuleType("torch._opaque_subclass_test_late")
    late.double = mod.double  # `from ..dummy import double`, run while patched
    sys.modules[late.__name__] = late
    try:
        assert late.double is not orig and late.double(2) == 5
        ps.disable()
        assert late.double is orig and mod.double is orig and alias.double is orig
    finally:
        ps.disable()
        del sys.modules[late.__name__]


def test_a_module_a_factory_imports_gets_its_waiting_patches(tmp_path, monkeypatch, dummy_module):
    """A patch waits for its module's import; the factory of a later patch of
    the same set imports that module while the set is being checked, before
    the import hook is in place. The waiting patch is applied by ``enable()``
    all the same (it stayed waiting forever, and torch ran stock there, when a
    fix's module imported Dynamo at import time)."""
    from opaque_subclass import patching

    mod, _ = dummy_module
    stem = f"_osc_wait_{tmp_path.name.replace('-', '_')}"
    target = f"torch.{stem}"  # waiting is for torch's modules: one in torch's namespace, from tmp_path
    (tmp_path / f"{stem}.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / f"{stem}_factory.py").write_text(
        f"import {target}  # the factory's module imports the waiting module, as Dynamo was\n\n"
        "def make(original):\n    return lambda *a: original(*a) + 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch, "__path__", [*torch.__path__, str(tmp_path)])
    torch_file = patching._module_file
    monkeypatch.setattr(
        patching, "_module_file", lambda name: str(tmp_path / f"{stem}.py") if name == target else torch_file(name)
    )
    expected = patching.source_fingerprint(target, ("double",))
    assert expected is not None and target not in sys.modules
    ps = PatchSet(
        [
            Patch(f"{target}.double", expected, _plus_one),
            Patch(f"{mod.__name__}.triple", fingerprint(mod.triple), f"{stem}_factory:make"),
        ]
    )
    try:
        ps.enable()
        module = sys.modules[target]
        assert ps.waiting == (), f"still waiting after enable(): {ps.waiting}"
        assert module.double(2) == 5 and mod.triple(2) == 7
        ps.disable()
        assert module.double(2) == 4 and mod.triple(2) == 6
    finally:
        ps.disable()
        for name in (target, f"{stem}_factory"):
            sys.modules.pop(name, None)


def test_caches_holding_the_target_are_rebuilt(dummy_module):
    """A cache torch fills from the target on first use (Dynamo's type-dispatch
    table keeps ``VariableBuilder.wrap_tensor``) is cleared whenever the patch is
    installed, suspended or removed, so it never serves a function no longer in place."""
    import functools

    mod, _ = dummy_module
    orig = mod.double
    mod.table = functools.cache(lambda: mod.double)  # like _type_dispatch_impl: built on first call
    assert mod.table() is orig
    ps = PatchSet([Patch(f"{mod.__name__}.double", fingerprint(orig), _plus_one, caches=(f"{mod.__name__}.table",))])
    ps.enable()
    try:
        assert mod.table() is mod.double and mod.table()(2) == 5
        with ps.suspended(f"{mod.__name__}.double"):
            assert mod.table() is orig
        assert mod.table() is mod.double is not orig
    finally:
        ps.disable()
    assert mod.table() is orig


def test_a_cache_that_cannot_be_found_refuses_the_set(dummy_module):
    mod, _ = dummy_module
    orig = mod.double
    ps = PatchSet([Patch(f"{mod.__name__}.double", fingerprint(orig), _plus_one, caches=(f"{mod.__name__}.triple",))])
    with pytest.raises(
        PatchRefused, match=r"triple \(a cache of .*double\): cannot be resolved \(.*not a functools cache"
    ):
        ps.enable()
    assert mod.double is orig and not ps.enabled


def test_disable_leaves_no_replacement_in_dynamos_dispatch_table():
    """Every release patches ``VariableBuilder.wrap_tensor`` (2.11: backport;
    2.12+: diagnostic fix), and Dynamo's type-dispatch table keeps the function
    it found when first built: after ``disable()`` it must be torch's again."""
    from torch._dynamo.variables.builder import VariableBuilder

    torch._dynamo.reset()
    torch.compile(lambda t: t + 1, backend="eager", fullgraph=True)(torch.ones(2))  # builds the table
    replacement = VariableBuilder.__dict__["wrap_tensor"]
    assert "opaque_subclass" in replacement.__module__
    assert VariableBuilder._type_dispatch()[torch.Tensor] is replacement
    try:
        opaque_subclass.disable()
        original = VariableBuilder.__dict__["wrap_tensor"]
        assert original is not replacement and original.__module__ == "torch._dynamo.variables.builder"
        assert VariableBuilder._type_dispatch()[torch.Tensor] is original
    finally:
        opaque_subclass.enable()
    assert VariableBuilder._type_dispatch()[torch.Tensor] is VariableBuilder.__dict__["wrap_tensor"] is not original


def test_patch_scoped_here_rebinds_only_that_module(dummy_module):
    mod, alias = dummy_module
    orig = mod.double
    target = f"{alias.__name__}.double"  # one module's import of a function defined elsewhere
    ps = PatchSet([Patch(target, fingerprint(orig), _plus_one, scope="here")])
    ps.enable()
    try:
        assert alias.double(2) == 5  # the import is replaced
        assert mod.double is orig and mod.double(2) == 4  # the definition is not
        with ps.suspended(target):
            assert alias.double is orig
        assert alias.double(2) == 5
    finally:
        ps.disable()
    assert alias.double is orig and mod.double is orig


def test_one_fingerprint_mismatch_refuses_the_whole_set(dummy_module):
    mod, alias = dummy_module
    orig_double, orig_triple = mod.double, mod.triple
    ps = PatchSet(
        [
            Patch(f"{mod.__name__}.double", fingerprint(mod.double), _plus_one),
            Patch(f"{mod.__name__}.triple", "0000000000000000", _plus_one),
        ]
    )
    with pytest.raises(PatchRefused, match=r"triple: source fingerprint [0-9a-f]{16}, expected 0000000000000000"):
        ps.enable()
    assert mod.double is orig_double and alias.double is orig_double and mod.triple is orig_triple
    assert not ps.enabled


def test_changed_dependency_refuses_the_whole_set(dummy_module):
    mod, alias = dummy_module
    orig_double = mod.double
    good = Patch(
        f"{mod.__name__}.double",
        fingerprint(mod.double),
        _plus_one,
        depends_on=((f"{mod.__name__}.triple", fingerprint(mod.triple)),),
    )
    assert PatchSet([good]).check() == []
    stale = Patch(
        f"{mod.__name__}.double", fingerprint(mod.double), _plus_one, depends_on=((f"{mod.__name__}.triple", "0" * 16),)
    )
    ps = PatchSet([stale])
    with pytest.raises(
        PatchRefused,
        match=rf"{mod.__name__}\.triple \(relied on by the patch of {mod.__name__}\.double\): source fingerprint [0-9a-f]{{16}}, expected 0{{16}}",
    ):
        ps.enable()
    assert mod.double is orig_double and alias.double is orig_double and not ps.enabled


def test_unresolvable_target_refuses(dummy_module):
    mod, _ = dummy_module
    ps = PatchSet([Patch(f"{mod.__name__}.missing", "0" * 16, _plus_one)])
    assert any("cannot be resolved" in p for p in ps.check())
    with pytest.raises(PatchRefused):
        ps.enable()


def test_native_mode_patches_nothing():
    if opaque_subclass.support().mode != "native":
        pytest.skip("native mode only")
    assert opaque_subclass.support().patched == ()
    fixes = opaque_subclass.support().fixes
    try:
        assert opaque_subclass.disable() == opaque_subclass.Support("native", torch.__version__, (), ())
        assert opaque_subclass.enable().patched == () and opaque_subclass.enable().fixes == fixes
    finally:
        opaque_subclass.enable()


# --------------------------------------------------------------------------- backport mode

if BACKPORT:
    from opaque_subclass.activation import BACKPORT as PATCH_SET


@needs_backport
def test_support_lists_every_patch():
    info = opaque_subclass.support()
    assert info.mode == "backport"
    assert info.patched == tuple(p.target for p in PATCH_SET.patches)
    assert len(info.patched) >= 10


@needs_backport
def test_every_patch_documents_what_it_replaces():
    for p in PATCH_SET.patches:
        doc = " ".join(p.doc.split())
        short = p.target.rsplit(".", 1)[-1]
        assert "Replaces" in doc and "torch 2.11" in doc, p.target
        assert "Without it" in doc and "With it" in doc and "2.12" in doc, p.target
        assert "pytorch/pytorch#176457" in doc, p.target
        assert short in doc or "helper" in doc, p.target


@needs_backport
def test_docs_list_every_patch():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    backport_doc = (root / "docs" / "backport.md").read_text()
    cli_doc = (root / "docs" / "cli.md").read_text()
    for target in opaque_subclass.support().patched:
        assert f"`{target}`" in backport_doc, f"docs/backport.md does not describe {target}"
        assert f"  - {target}" in cli_doc, f"docs/cli.md output does not list {target}"
    assert f"patched         {len(opaque_subclass.support().patched)} torch function(s)" in cli_doc
    count = f"replaces {len(opaque_subclass.support().patched)} torch functions"
    assert count in " ".join(backport_doc.split()), f"docs/backport.md's introduction must say it {count}"


@needs_backport
def test_no_torch_module_keeps_an_unpatched_alias():
    from opaque_subclass.patching import _resolve

    for record in PATCH_SET._applied:
        owner, attr, _ = _resolve(record.patch.target)
        if isinstance(owner, type):
            assert owner.__dict__[attr] is record.replacement
            continue
        if record.patch.scope == "here":  # only this module's name (torch's public function stays)
            assert owner.__dict__[attr] is record.replacement, record.patch.target
            continue
        for name, module in list(sys.modules.items()):
            if module is not None and name.startswith("torch"):
                for key, value in list(getattr(module, "__dict__", {}).items()):
                    assert value is not record.original, f"{name}.{key} still holds the original {record.patch.target}"


@needs_backport
def test_disable_restores_stock_torch_and_enable_reapplies():
    from opaque_subclass.patching import _raw, _resolve

    originals = {a.patch.target: a.original for a in PATCH_SET._applied}
    try:
        assert opaque_subclass.disable().patched == ()
        assert opaque_subclass.disable().patched == ()
        for target, original in originals.items():
            owner, attr, _ = _resolve(target)
            assert _raw(owner, attr) is original, target
        torch._dynamo.reset()
        with pytest.raises(
            torch._dynamo.exc.InternalTorchDynamoError,
            match=r"^AttributeError: 'Mesh' object has no attribute 'is_nested'\n",
        ):
            _compile_forward()
    finally:
        info = opaque_subclass.enable()
    assert info.patched == tuple(p.target for p in PATCH_SET.patches)
    assert set(originals) <= set(info.patched)
    assert opaque_subclass.enable().patched == info.patched
    torch._dynamo.reset()
    _compile_forward()


@needs_backport
def test_cli_compile_checks_fail_on_stock_torch():
    from opaque_subclass.cli import selfcheck

    selfcheck._setup()
    opaque_subclass.disable()
    try:
        for check in (selfcheck.check_compile_forward, selfcheck.check_compile_backward):
            with pytest.raises(
                torch._dynamo.exc.InternalTorchDynamoError,
                match=r"^AttributeError: '\w+' object has no attribute 'is_nested'\n",  # the self-check's own opaque class
            ):
                check()
    finally:
        opaque_subclass.enable()
    assert selfcheck.check_compile_forward().startswith("5 calls")


@needs_backport
def test_unexpected_torch_build_is_refused_whole():
    code = textwrap.dedent(
        """
        import warnings, torch
        import torch._subclasses.fake_tensor as ft
        import torch._dynamo.variables.builder as builder
        original_ad = builder._automatic_dynamic
        def is_fake(x):  # a "different build" of one patched function: torch's module, other source
            return False
        is_fake.__module__ = ft.__name__  # (a function of another module is another package's patch)
        ft.is_fake = is_fake
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import opaque_subclass
        info = opaque_subclass.support()
        assert info.mode == "unsupported" and info.patched == (), info
        assert builder._automatic_dynamic is original_ad
        assert ft.is_fake is is_fake
        msgs = [str(w.message) for w in caught]
        assert any("is_fake" in m and "differs from the one the backport was written for" in m and "torch==2.11.0" in m for m in msgs), msgs
        print("REFUSED")
        """
    )
    out = warm.run([sys.executable, "-c", code], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED" in out.stdout


# Scenarios: each exercises a slice of the compile stack on subclasses with opaques.


def _compile_forward():
    f = torch.compile(lambda x: x + 1, backend="aot_eager", fullgraph=True)
    for i in range(2):
        m = Mesh(str(i))
        out = f(MeshTensor(torch.ones(2), m))
        assert out._mesh is m, f"call {i}: the output carries {out._mesh!r}, expected {m!r}"


def _nested_backward():
    f = torch.compile(lambda x, y: ((x * y).sum(), y + 1), backend="aot_eager", fullgraph=True)
    for i in range(2):
        m = Mesh(str(i))
        x = MeshTensor(MeshTensor(torch.ones(3), Mesh("in")), m).requires_grad_(True)
        y = MeshTensor(MeshTensor(torch.ones(3), Mesh("in2")), m)
        s, y2 = f(x, y)
        s.backward()
        assert x.grad._mesh is m, f"call {i}: x.grad carries {x.grad._mesh!r}, expected {m!r}"
        assert y2._mesh is m, f"call {i}: the output carries {y2._mesh!r}, expected {m!r}"


def _compile_subclass_without_repr():
    """Forward and backward of a subclass that keeps torch's default ``__repr__``: torch 2.11
    formats its AOTAutograd metadata (the traced subclass inputs and tangents) on every compilation."""
    f = torch.compile(lambda x: x * 2, backend="aot_eager", fullgraph=True)
    for i in range(2):
        m = Mesh(str(i))
        x = BareMeshTensor(torch.ones(2), m).requires_grad_(i == 1)
        out = f(x)
        assert out._mesh is m, f"call {i}: the output carries {out._mesh!r}, expected {m!r}"
        if i == 1:
            out.sum().backward()
            assert x.grad._mesh is m and x.grad._data.tolist() == [2.0, 2.0]


def _compiled_autograd_keeps_one_graph():
    """A backward saving the input's mesh, run under compiled autograd for two calls on other
    meshes: one compiled-autograd graph, each gradient on its call's mesh."""
    import torch._dynamo.compiled_autograd as ca
    from torch._dynamo.testing import CompileCounterWithBackend

    f = torch.compile(lambda x: (x * x).sum(), backend="aot_eager", fullgraph=True)
    backward = CompileCounterWithBackend("aot_eager")
    for i in range(2):
        m = Mesh(str(i))
        x = MeshTensor(torch.arange(3.0), m).requires_grad_()
        out = f(x)
        with ca._enable(torch.compile(backend=backward)):
            out.backward()
        assert x.grad._mesh is m and x.grad._data.tolist() == [0.0, 2.0, 4.0], f"call {i}: {x.grad._mesh!r}"
    assert backward.frame_count == 1, f"compiled autograd compiled {backward.frame_count} graphs"


def _mark_dynamic_nested():
    """``mark_dynamic`` on a nested subclass whose levels each hold a mesh: one compilation for
    three sizes, each output on its call's meshes."""
    from torch._dynamo.testing import CompileCounterWithBackend

    count = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda x: x * 2, backend=count, fullgraph=True)
    for n in (4, 6, 8):
        inner_mesh, outer_mesh = Mesh(f"in{n}"), Mesh(f"out{n}")
        x = MeshTensor(MeshTensor(torch.ones(n), inner_mesh), outer_mesh)
        torch._dynamo.mark_dynamic(x, 0)
        out = f(x)
        assert out._mesh is outer_mesh and out._data._mesh is inner_mesh, f"size {n}"
    assert count.frame_count == 1, f"{count.frame_count} compilations for 3 sizes"


@torch.library.custom_op("test_backport::name_length", mutates_args=())
def _name_length(t: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    return t + len(mesh.name)


@_name_length.register_fake
def _(t: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    return torch.empty_like(t)


def _inductor_counts_an_opaque_buffer():
    """A custom op taking a subclass's mesh, compiled with inductor while inductor's metrics
    log is on (it counts the bytes of each buffer of its graph, the mesh's among them)."""
    with inductor_metrics_log_on(), fresh_inductor_cache():  # a graph inductor compiles, not one its cache serves
        f = torch.compile(lambda x: _name_length(x._data, x._mesh), backend="inductor", fullgraph=True)
        out = f(MeshTensor(torch.ones(2), Mesh("abc")))
        assert out.tolist() == [4.0, 4.0], out


def _no_grad_mutation():
    def fn(x):
        with torch.no_grad():
            x.add_(1)
        return x * 2

    x = MeshTensor(torch.ones(3), Mesh("mut")).requires_grad_(True)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    assert out._mesh is x._mesh, f"the output carries {out._mesh!r}, expected {x._mesh!r}"
    assert torch.equal(x._data, torch.full((3,), 2.0)), f"x holds {x._data}, expected 2.0 everywhere"


def _error_names_argument_path():
    """The library's TypeError (raised as itself, not wrapped by Dynamo), naming the argument path."""
    x = MeshTensor(torch.ones(2), Mesh("m"))
    x._mesh = 3
    f = torch.compile(lambda x: x + 1, backend="aot_eager", fullgraph=True)
    with pytest.raises(opaque_subclass.OpaqueTypeError) as info:
        f(x)
    msg = str(info.value)
    assert "L['x']._mesh" in msg and "holds int" in msg, msg


def _backward_reads_primal_opaque():
    f = torch.compile(lambda x: (x * 2).sum(), backend="aot_eager", fullgraph=True)
    x = MeshTensor(torch.ones(3), Mesh("primal")).requires_grad_(True)
    out = f(x)
    out.backward(MeshTensor(torch.ones(()), Mesh("tangent")))
    assert x.grad._mesh is x._mesh, f"x.grad carries {x.grad._mesh!r}, expected {x._mesh!r}"


def _generated_per_call_path():
    _runtime_wrap_uses_generated_code()
    _runtime_unwrap_skips_tensor_flatten()


def _runtime_wrap_uses_generated_code():
    from torch._functorch._aot_autograd import schemas

    f = torch.compile(lambda x: x * 2, backend="aot_eager", fullgraph=True)
    f(MeshTensor(torch.ones(2), Mesh("warm")))
    calls = []
    original = schemas.SubclassCreationMeta.creation_fn

    def spy(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    schemas.SubclassCreationMeta.creation_fn = spy
    try:
        m = Mesh("run")
        out = f(MeshTensor(torch.ones(2), m))
        assert out._mesh is m, f"the output carries {out._mesh!r}, expected {m!r}"
    finally:
        schemas.SubclassCreationMeta.creation_fn = original
    assert calls == [], "torch's generic creation_fn ran at run time"


def _runtime_unwrap_skips_tensor_flatten():
    class Counted(MeshTensor):
        calls = 0

        def __tensor_flatten__(self):
            Counted.calls += 1
            return super().__tensor_flatten__()

        @staticmethod
        def __tensor_unflatten__(inner, ctx, size, stride):
            return Counted(inner["_data"], inner["_mesh"])

    f = torch.compile(lambda x: x + 1, backend="aot_eager", fullgraph=True)
    f(Counted(torch.ones(2), Mesh("warm")))
    x = Counted(torch.ones(2), Mesh("run"))
    before = Counted.calls
    out = f(x)
    assert out._mesh is x._mesh, f"the output carries {out._mesh!r}, expected {x._mesh!r}"
    # Dynamo's guards read the flatten context and names (2 calls); torch
    # 2.11's generic unwrap would add another.
    assert Counted.calls - before <= 2, f"__tensor_flatten__ calls in one call: {Counted.calls - before}"


class _Split(torch.nn.Module):
    """right_inverse returns [tensor, reference opaque]."""

    def forward(self, data, mesh):
        return MeshTensor(data, mesh)

    def right_inverse(self, value):
        return [value._data, value._mesh]


def _parametrize_stores_opaques():
    from torch.nn.utils import parametrize

    m = Mesh("p")
    lin = torch.nn.Linear(2, 2)
    lin.weight = torch.nn.Parameter(MeshTensor(torch.ones(2, 2), m))
    parametrize.register_parametrization(lin, "weight", _Split(), unsafe=True)
    stored = lin.parametrizations.weight.original1
    assert stored is m, f"the parametrization stores {stored!r}, expected {m!r}"
    assert lin.weight._mesh is m, f"lin.weight carries {lin.weight._mesh!r}, expected {m!r}"
    assert "parametrizations.weight.original1" not in lin.state_dict()


def _parametrize_assignment_replaces_opaque():
    from torch.nn.utils import parametrize

    lin = torch.nn.Linear(2, 2)
    lin.weight = torch.nn.Parameter(MeshTensor(torch.ones(2, 2), Mesh("old")))
    parametrize.register_parametrization(lin, "weight", _Split(), unsafe=True)
    new = Mesh("new")
    lin.weight = MeshTensor(torch.zeros(2, 2), new)
    assert lin.weight._mesh is new, f"lin.weight carries {lin.weight._mesh!r}, expected {new!r}"
    assert torch.equal(lin.parametrizations.weight.original0, torch.zeros(2, 2))


def _export_subclass_input_non_strict():
    class Affine(torch.nn.Module):
        def forward(self, x):
            return x * 2 + 1

    ep = torch.export.export(Affine(), (MeshTensor(torch.ones(3), Mesh("ex")),), strict=False)
    other = MeshTensor(torch.zeros(3), Mesh("run"))
    out = ep.module()(other)
    assert out._mesh is other._mesh, f"the output carries {out._mesh!r}, expected {other._mesh!r}"


def _device_mesh_is_a_graph_input():
    from opaque_subclass.sharded.collectives import all_reduce_sum

    with registered_mesh_world_of_one(timeout_s=30) as mesh:
        f = torch.compile(lambda x, m: (all_reduce_sum(x, m) * 2, m), backend="aot_eager", fullgraph=True)
        out, got = f(torch.ones(2), mesh)
        assert got is mesh, f"returned {got!r}, expected the input mesh {mesh!r}"
        assert torch.equal(out, torch.full((2,), 2.0)), out


def test_a_dtensors_own_mesh_stays_a_compile_time_constant():
    """With ``DeviceMesh`` registered, a mesh reached through a DTensor's flatten
    context (``x.device_mesh``) stays Dynamo's ``DeviceMeshVariable``, which
    DTensor's handlers need on every release; a mesh input is an opaque
    (``is_device_mesh`` tells them apart by its caller's source). Stock torch
    2.11 with the registration fails: "TorchScriptObjectVariable(FakeScriptObject)
    is self-referential"."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    def f(x, z):
        y = x.redistribute(x.device_mesh, [Replicate()])
        # two inputs' meshes compared, as DTensor code does: Dynamo 2.11 compares constant meshes only
        factor = 2 if x.device_mesh == z.device_mesh else 3
        return DTensor.from_local(y.to_local() * factor, x.device_mesh, [Replicate()])

    with registered_mesh_world_of_one(timeout_s=30) as mesh:
        x, z = (distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]) for _ in range(2))
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x, z)
        assert torch.equal(out.to_local(), torch.arange(4.0) * 2), out.to_local()


def _export_after_unwrap(strict):
    from opaque_subclass import OpaqueSubclass, unwrap_subclass_parameters

    class Lifted(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}

    class Scale(torch.nn.Module):
        def __init__(self, mesh):
            super().__init__()
            self.w = torch.nn.Parameter(Lifted(torch.arange(3.0), mesh))

        def forward(self, x):
            return self.w * x

    mesh = Mesh("strict" if strict else "lift")
    module = unwrap_subclass_parameters(Scale(mesh))
    ep = torch.export.export(module, (torch.ones(3),), strict=strict)
    out = ep.module()(torch.ones(3))
    assert out._mesh is mesh, f"the output carries {out._mesh!r}, expected {mesh!r}"


def _export_after_unwrap_lifts_opaque():
    _export_after_unwrap(strict=False)


def _strict_export_reads_captured_opaque():
    _export_after_unwrap(strict=True)


def _torch_unwrap_parametrization_keeps_opaque():
    torch_subclass_parametrization_keeps_opaques("aot_eager")


def _backport_cache_entries_keyed_apart():
    """An inductor compile of a graph with an opaque input looks its AOTAutograd
    cache entry up under a key stock torch never computes."""
    import logging

    keys: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "cache miss for key" in record.getMessage() or "cache hit for key" in record.getMessage():
                keys.append(record.getMessage())

    logger = logging.getLogger("torch._functorch._aot_autograd.autograd_cache")
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with fresh_inductor_cache():
            f = torch.compile(lambda x: x * 2, backend="inductor", fullgraph=True)
            m = Mesh("keyed")
            assert f(MeshTensor(torch.ones(2), m))._mesh is m
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert keys and all("-opaque-sharing-" in k for k in keys), keys


_DYNAMO = torch._dynamo.exc
#: How the aot_eager backend reports an exception raised while compiling.
_AOT = r"^backend='aot_eager' raised:\n"
#: The end of a scenario's own assertion message (pytest may append its explanation).
_END = r"(\n|$)"

#: A compiled DTensor program returning the compile-time mesh: 15 of 16 calls
#: (16 after an earlier run of the scenario in the process).
_DTENSOR_STALE = StockFailure(AssertionError, r"^1[56] of 16 outputs carry another call's mesh$")

#: torch's default ``Tensor.__repr__`` of a traced subclass reads its (fake) values.
_UNPRINTABLE_TRACED_SUBCLASS = StockFailure(
    _DYNAMO.BackendCompilerFailed,
    _AOT + r"GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq\(u0, 0\)",
)

#: target -> (the scenario that needs the patch, how it fails on stock torch
#: 2.11 with just that patch suspended). Measured on torch 2.11.0.
NEEDED_BY: dict[str, tuple[Callable[[], object], StockFailure]] = {
    "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent": (
        # a wrong result: the gradient carries the tangent's attribute at the output's name
        backward_refuses_a_tangent_listing_other_attributes,
        TANGENT_LIST_FAILURE,
    ),
    "torch._library.fake_class_registry.tracing_with_real": (
        compile_takes_an_opaque_answering_every_name,
        ANSWERING_OPAQUE_FAILURE,
    ),
    "torch.nn.utils.parametrize.ParametrizationList.forward": (
        # the opaque leaf's AttributeError hidden by the property: the property is reported missing
        parametrization_names_a_deleted_opaque_leaf,
        DELETED_LEAF_FAILURE,
    ),
    "torch._functorch._aot_autograd.subclass_utils.wrap_tensor_subclasses": (
        # torch 2.11's generic walk rebuilding each gradient on every backward
        gradients_rebuilt_by_generated_code,
        GENERIC_GRADIENT_WALK_FAILURE,
    ),
    "torch._functorch._aot_autograd.runtime_wrappers.is_opaque_type": (
        # torch's registry asked per saved opaque on every forward
        saved_opaques_checked_once_per_class,
        SAVED_OPAQUE_CHECK_FAILURE,
    ),
    "torch._functorch._aot_autograd.runtime_wrappers.runtime_unwrap_tensor_subclasses": (
        # torch 2.11's walk of the saved values on every backward
        saved_values_passed_without_a_walk,
        SAVED_VALUES_WALK_FAILURE,
    ),
    "torch._dynamo.guards.GuardBuilder.TENSOR_SUBCLASS_METADATA_MATCH": (
        # torch's context check, a Python call of __tensor_flatten__ per input and call
        constant_flatten_guarded_once_per_class,
        FLATTEN_GUARDED_PER_INPUT_FAILURE,
    ),
    "torch._dynamo.guards.GuardBuilder.EQUALS_MATCH": (
        # torch's attribute-list check, a Python call of __tensor_flatten__ per input and call
        constant_flatten_guarded_once_per_class,
        FLATTEN_GUARDED_PER_INPUT_FAILURE,
    ),
    "torch._dynamo.guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH": (
        # torch's guard on the whole rank map: one compilation per mesh of one shape
        meshes_of_one_shape_compile_once,
        MESH_RECOMPILED_FAILURE,
    ),
    "torch._dynamo.variables.script_object.TorchScriptObjectVariable.call_method": (
        member_method_result_is_guarded,
        MEMBER_UNGUARDED_FAILURE,
    ),
    "torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr": (
        undeclared_member_is_named,
        UNDECLARED_MEMBER_FAILURE,
    ),
    "torch._dynamo.variables.builtin.BuiltinVariable.call_isinstance": (
        collectives_on_group_attribute_compile_per_group,
        COLLECTIVE_GROUP_TYPE_FAILURE,
    ),
    "torch._dynamo.variables.distributed.ProcessGroupVariable.is_process_group": (
        program_on_groups_compiles_once,
        StockFailure(AssertionError, r"^compiled 3 times for 3 groups$"),
    ),
    "torch._subclasses.fake_tensor.get_plain_tensors": (
        export_names_malformed_flatten_names,
        MALFORMED_NAMES_FAILURE,
    ),
    "torch._export.non_strict_utils.fakify": (
        # a silent wrong result: the input is traced as the plain tensor its __tensor_unflatten__ returns
        export_names_a_wrong_unflatten,
        WRONG_UNFLATTEN_EXPORTED,
    ),
    "torch.export.pt2_archive._package._package_constants": (
        save_and_load_opaque_constant,
        SAVE_CONSTANT_FAILURE,
    ),
    "torch.export.pt2_archive._package._load_constants": (
        save_and_load_opaque_constant,
        LOAD_CONSTANT_FAILURE,
    ),
    "torch.export.pt2_archive._package._save_pickled_tensors": (
        direct_save_of_subclass_parameter_is_refused,
        StockFailure(
            AssertionError, r"^torch\.export\.save pickled the reference opaque of a subclass parameter by value" + _END
        ),
    ),
    # DTensor's mesh as an opaque attribute (backport/dtensor.py)
    "torch.distributed.tensor._api.DTensor.__tensor_flatten__": (dtensor_outputs_on_runtime_mesh, _DTENSOR_STALE),
    "torch.distributed.tensor._api.DTensor.__tensor_unflatten__": (dtensor_outputs_on_runtime_mesh, _DTENSOR_STALE),
    "torch.fx.experimental.proxy_tensor.get_proxy_slot": (dtensor_outputs_on_runtime_mesh, _DTENSOR_STALE),
    "torch._dynamo.variables.torch.TorchInGraphFunctionVariable._get_handlers": (
        dtensor_handlers_take_registered_mesh,
        DTENSOR_MESH_CONSTANT_FAILURE,
    ),
    "torch._dynamo.variables.tensor.TensorVariable.method_redistribute": (
        dtensor_handlers_take_registered_mesh,
        DTENSOR_MESH_CONSTANT_FAILURE,
    ),
    "torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr": (
        dtensor_handlers_take_registered_mesh,
        # Dynamo asserts that every listed attribute of a tensor computed in the graph is a tensor
        StockFailure(AssertionError, r"^\n\nfrom user code:\n(.|\n)*e\.device_mesh\.ndim"),
    ),
    "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.save": (
        # another group's program: rank 2 gets the entry rank 0 compiled for group '1'
        no_rank_loads_another_groups_entry,
        ANOTHER_GROUPS_ENTRY_FAILURE,
    ),
    "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.evaluate_guards": (
        # torch's guard evaluation cannot read the record: no rank gets the entry, not even its group's
        no_rank_loads_another_groups_entry,
        ENTRY_GUARD_UNREAD_FAILURE,
    ),
    "torch._inductor.graph.GraphLowering.run_node": (
        # a DTensor made in the region on a mesh argument returns the mesh as a graph constant
        dtensor_made_on_a_mesh_argument_compiles_with_inductor,
        DTENSOR_MESH_CONSTANT_LOWERING_FAILURE,
    ),
    "torch._inductor.codecache.FxGraphCache._check_for_hop": (
        # the same graph served from the FX graph cache has lost that constant
        dtensor_made_on_a_mesh_argument_compiles_with_inductor,
        DTENSOR_MESH_CONSTANT_CACHE_FAILURE,
    ),
    "torch._functorch._aot_autograd.autograd_cache.check_cacheable": (
        # a wrong result (pytorch#194658): a checkpointed untraced function served stale
        checkpointed_untraced_function_is_not_served_stale,
        UNTRACED_FUNCTION_FAILURE,
    ),
    "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key": (
        _backport_cache_entries_keyed_apart,
        # The only key looked up is one stock torch computes (no "-opaque-sharing-").
        StockFailure(AssertionError, r"^\['AOTAutograd cache miss for key [a-z0-9]+'\]" + _END),
    ),
    "torch._functorch._aot_autograd.subclass_parametrization.UnwrapTensorSubclass.right_inverse": (
        _torch_unwrap_parametrization_keeps_opaque,
        StockFailure(AttributeError, r"^'Mesh' object has no attribute '__tensor_flatten__'$"),
    ),
    "torch._functorch._aot_autograd.subclass_parametrization.UnwrapTensorSubclass.forward": (
        _torch_unwrap_parametrization_keeps_opaque,
        StockFailure(AttributeError, r"^'OpaqueSlot' object has no attribute 'attrs'$"),
    ),
    "torch._dynamo.convert_frame.fullgraph_capture": (
        _strict_export_reads_captured_opaque,
        # torch asserts that the captured opaque's source has an example value.
        StockFailure(
            AssertionError, r"^AttrSource\(base=UnspecializedNNModuleSource\(.*index='w'\)\), member='original1'\)$"
        ),
    ),
    "torch._export.passes.lift_constants_pass.lift_constants_pass": (
        _export_after_unwrap_lifts_opaque,
        StockFailure(
            AssertionError, r"^expected int, Tensor, or FakeScriptObject key, got <class 'subclasses\.Mesh'>$"
        ),
    ),
    "torch.export.unflatten._assign_attr": (
        _export_after_unwrap_lifts_opaque,
        StockFailure(
            AssertionError,
            r"^expected torch\.Tensor or torch\.ScriptObject for CONSTANT attr_kind, got <class 'subclasses\.Mesh'>$",
        ),
    ),
    "torch._dynamo.variables.distributed.DeviceMeshVariable.is_device_mesh": (
        _device_mesh_is_a_graph_input,
        StockFailure(
            _DYNAMO.Unsupported,
            r"^Failed to convert args/kwargs to proxy\n  Explanation: Missing `as_proxy\(\)` implementation for some arg/kwarg\.\n"
            r"(?s:.*)call_function args: LazyVariableTracker\(realized: TensorVariable\(\)\) "
            r"LazyVariableTracker\(realized: DeviceMeshVariable\(\)\)",
        ),
    ),
    "torch.distributed._tools.common_utils.get_untyped_storages": (
        storage_accounting_skips_opaques,
        StockFailure(
            UserWarning,  # raised: the scenario turns warnings into errors
            r"^Expected a tensor or a traceable wrapper-subclass of tensor, but got <class 'subclasses\.Mesh'>$",
        ),
    ),
    "torch.distributed.fsdp._init_utils._sync_module_params_and_buffers": (
        fsdp1_module_state_sync_keeps_opaques,
        StockFailure(
            TypeError,
            r"^_broadcast_coalesced\(\): incompatible function arguments\.(?s:.*)\nInvoked with: .*"
            r"\[tensor\(\[1\., 1\.\]\), Mesh\('fsdp'\), MeshTensor\(shape=\(3,\)\), Mesh\('fsdp'\)\]",
        ),
    ),
    "torch._export.non_strict_utils._create_symbolic_context_for_tensor": (
        _export_subclass_input_non_strict,
        StockFailure(AttributeError, r"^'Mesh' object has no attribute 'shape'$"),
    ),
    "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchSubclassWrapper.post_compile": (
        # torch 2.11's generic unwrap reads each input's __tensor_flatten__ once more (its
        # generic wrap is generated by the wrap_tensor_subclasses patch either way)
        _generated_per_call_path,
        StockFailure(AssertionError, r"^__tensor_flatten__ calls in one call: 3" + _END),
    ),
    "torch.nn.utils.parametrize.ParametrizationList.__init__": (
        _parametrize_stores_opaques,
        StockFailure(
            ValueError,
            r"^'right_inverse' must return a Tensor or a Sequence of tensors \(list, tuple\.\.\.\)\. "
            r"Got element 1 of the sequence with type Mesh\.$",
        ),
    ),
    "torch.nn.utils.parametrize.ParametrizationList.right_inverse": (
        _parametrize_assignment_replaces_opaque,
        StockFailure(ValueError, r"^`right_inverse` must return a sequence of tensors\. Got element 1 of type Mesh$"),
    ),
    "torch.fx.experimental.proxy_tensor.set_proxy_slot": (
        _backward_reads_primal_opaque,
        # A wrong result: the gradient takes the tangent's opaque.
        StockFailure(AssertionError, r"^x\.grad carries Mesh\('tangent'\), expected Mesh\('primal'\)" + _END),
    ),
    "torch._dynamo.variables.builder.VariableBuilder.wrap_tensor": (
        _error_names_argument_path,
        # The library's error, raised later, without the argument's path.
        StockFailure(
            AssertionError,
            r"^'int' found in tensor attrs of MeshTensor\.__tensor_flatten__\(\)\. Only tensors and reference-type "
            r"opaques are allowed in tensor attrs\. subclasses\.MeshTensor\.__tensor_flatten__\(\) lists attribute "
            r"'_mesh' \(path 'x\._mesh'\), which holds int\.",
        ),
    ),
    "torch._subclasses.meta_utils.MetaTensorDescriber.describe_tensor": (
        _compile_forward,
        StockFailure(_DYNAMO.InternalTorchDynamoError, r"^AttributeError: 'Mesh' object has no attribute 'is_leaf'\n"),
    ),
    "torch._subclasses.fake_tensor.is_fake": (
        _compile_forward,
        StockFailure(AssertionError, r"^got mixed fake and real tensors!\n"),
    ),
    "torch._subclasses.fake_tensor.maybe_get_fake_mode": (
        _compile_forward,
        StockFailure(AssertionError, r"^All fake tensor modes must be the same\n"),
    ),
    "torch._dynamo.variables.builder._automatic_dynamic": (
        _compile_forward,
        StockFailure(
            _DYNAMO.InternalTorchDynamoError, r"^AttributeError: 'Mesh' object has no attribute 'is_nested'\n"
        ),
    ),
    "torch._inductor.ir.TorchBindObject.get_buf_bytes": (
        _inductor_counts_an_opaque_buffer,
        # torch 2.11 asks the opaque for torchbind's __obj_flatten__
        StockFailure(torch._inductor.exc.InductorError, r"^AssertionError: \n"),
    ),
    "torch._dynamo.decorators._apply_func_to_inner_tensors_of_same_dim": (
        _mark_dynamic_nested,
        StockFailure(AttributeError, r"^'Mesh' object has no attribute 'dim'$"),
    ),
    "torch._dynamo.variables.builder.handle_traced_output": (
        _compiled_autograd_keeps_one_graph,
        # the backward's prologue returns the saved mesh as a fake wrapper: a graph break
        StockFailure(AssertionError, r"^compiled autograd compiled 2 graphs" + _END),
    ),
    "torch.fx.experimental.symbolic_shapes.ShapeEnv.produce_guards_verbose": (
        _compile_forward,
        StockFailure(_DYNAMO.InternalTorchDynamoError, r"^KeyError: _mesh\n"),
    ),
    "torch._functorch._aot_autograd.subclass_utils.create_subclass_metadata": (
        _nested_backward,
        StockFailure(
            _DYNAMO.BackendCompilerFailed, _AOT + r"AttributeError: 'Mesh' object has no attribute 'layout'\n"
        ),
    ),
    "torch._functorch._aot_autograd.subclass_utils.unwrap_tensor_subclasses": (
        _compile_forward,
        # A wrong result: the first call's opaque is baked into the graph.
        StockFailure(AssertionError, r"^call 1: the output carries Mesh\('0'\), expected Mesh\('1'\)" + _END),
    ),
    "torch._functorch._aot_autograd.schemas.SubclassCreationMeta.__repr__": (
        _compile_subclass_without_repr,
        _UNPRINTABLE_TRACED_SUBCLASS,
    ),
    "torch._functorch._aot_autograd.schemas.ViewAndMutationMeta.__repr__": (
        _compile_subclass_without_repr,
        _UNPRINTABLE_TRACED_SUBCLASS,
    ),
    "torch._functorch._aot_autograd.graph_capture_wrappers.sc_visit": (
        _no_grad_mutation,
        StockFailure(
            _DYNAMO.BackendCompilerFailed,
            _AOT + r"AttributeError: Tried to call __getattr__ with attr 'elem' on a FakeScriptObject,",
        ),
    ),
    "torch._functorch._aot_autograd.functional_utils.is_fun": (
        _compile_forward,
        StockFailure(
            _DYNAMO.BackendCompilerFailed,
            _AOT + r"AssertionError: mixed functional/non-functional inner tensors: any_fun=True, all_fun=False\n",
        ),
    ),
    "torch._functorch._aot_autograd.functional_utils.sync_functional_tensor": (
        _nested_backward,
        StockFailure(
            _DYNAMO.BackendCompilerFailed,
            _AOT + r"TypeError: _functionalize_sync\(\): incompatible function arguments\.(?s:.*)\n"
            r"Invoked with: <torch\._library\.fake_class_registry\.FakeScriptObject object at 0x[0-9a-f]+>\n",
        ),
    ),
    "torch._functorch._aot_autograd.functional_utils.are_all_mutations_under_no_grad_or_inference_mode": (
        _no_grad_mutation,
        StockFailure(
            _DYNAMO.BackendCompilerFailed,
            _AOT + r"AssertionError: expected FunctionalTensor, got <class 'subclasses\.Mesh'>\n",
        ),
    ),
    "torch._dynamo.convert_frame._compile": (
        # the library's error re-raised as InternalTorchDynamoError("OpaqueTypeError: ...")
        compile_raises_the_librarys_error,
        LIBRARY_ERROR_WRAPPED_FAILURE,
    ),
    # a wrong result: the Tally made while tracing compiled in, shared by every call (pytorch#176044)
    "torch.fx.experimental.proxy_tensor.PythonKeyTracer.create_arg": (
        reference_opaque_made_while_tracing_is_named,
        MADE_WHILE_TRACING_FAILURE,
    ),
    "torch._opaque_base.OpaqueBaseMeta.__call__": (
        reference_opaque_made_while_tracing_is_named,
        MADE_WHILE_TRACING_FAILURE,
    ),
}


@needs_backport
def test_every_patch_has_a_scenario():
    assert set(NEEDED_BY) == {p.target for p in PATCH_SET.patches}


@needs_backport
@pytest.mark.parametrize("target", sorted(NEEDED_BY))
def test_patch_is_needed(target):
    """The scenario passes with every patch, and with just this one suspended
    fails exactly as recorded (type and message)."""
    scenario, stock_failure = NEEDED_BY[target]
    torch._dynamo.reset()
    scenario()  # passes with every patch
    torch._dynamo.reset()
    try:
        with PATCH_SET.suspended(target):
            assert_fails_as(scenario, stock_failure)
    finally:
        torch._dynamo.reset()


@needs_backport
def test_disable_restores_torch_modules_imported_after_enable():
    code = textwrap.dedent(
        """
        import sys
        import opaque_subclass
        import torch._subclasses.fake_tensor as ft
        patched = ft.is_fake
        assert "torch.testing._internal.subclasses" not in sys.modules
        import torch.testing._internal.subclasses as late  # imports is_fake by name, now
        assert late.is_fake is patched
        opaque_subclass.disable()
        assert ft.is_fake is not patched and late.is_fake is ft.is_fake, (late.is_fake, ft.is_fake)
        opaque_subclass.enable()
        assert late.is_fake is ft.is_fake is not None
        print("RESTORED")
        """
    )
    out = warm.run([sys.executable, "-c", code], timeout=300)
    assert out.returncode == 0 and "RESTORED" in out.stdout, out.stdout + out.stderr[-3000:]


# --------------------------------------------------------------------------- torch's own tests on 2.11 (#38)
# Programs of upstream's test_opaque_obj_v2.py in the backport's scope that stock torch 2.11 with the
# patches as first written failed; each runs on every release (natively on 2.12+).


def _opaque_of_a_subclass_made_in_the_graph() -> None:
    """``y._mesh`` of a subclass ``y`` computed in the compiled function, passed to a custom op:
    each call's mesh, one compilation."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return add_name_length(y._data, y._mesh)

    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(fn, backend=counter, fullgraph=True)
    for name in ("ab", "abcd"):
        out = f(MeshTensor(torch.ones(3), Mesh(name)))
        assert out.tolist() == [2.0 + len(name)] * 3, f"Mesh({name!r}): {out.tolist()}"
    assert counter.frame_count == 1, f"{counter.frame_count} compilations"


def test_opaque_of_a_subclass_made_in_the_graph():
    torch._dynamo.reset()
    _opaque_of_a_subclass_made_in_the_graph()
    if BACKPORT:  # stock torch 2.11 takes every listed attribute for a tensor
        torch._dynamo.reset()
        with PATCH_SET.suspended("torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr"):
            assert_fails_as(
                _opaque_of_a_subclass_made_in_the_graph,
                StockFailure(AssertionError, r"^\n\nfrom user code:\n(.|\n)*y\._mesh"),
            )
    torch._dynamo.reset()


def test_compiled_autograd_backward_of_a_subclass_with_an_opaque():
    """Compiled autograd fake-converts the gradient of ``sum()``, an ``expand`` view of the subclass:
    each call's gradient is a ``MeshTensor`` carrying that call's mesh (2.11 with the describer's
    view lookup; was ``KeyError: '_mesh'`` in torch's ``view_from_base``)."""
    import torch._dynamo.compiled_autograd as compiled_autograd

    torch._dynamo.reset()
    try:
        f = torch.compile(lambda x: x * 2, backend="aot_eager", fullgraph=True)
        for i in range(2):
            m = Mesh(str(i))
            x = MeshTensor(torch.ones(3), m).requires_grad_(True)
            out = f(x)
            assert out._mesh is m, f"call {i}: the output carries {out._mesh!r}"
            with compiled_autograd._enable(torch.compile(backend="eager")):
                out.sum().backward()
            assert isinstance(x.grad, MeshTensor), f"call {i}: x.grad is {type(x.grad).__name__}"
            assert x.grad._mesh is m, f"call {i}: x.grad carries {x.grad._mesh!r}, expected {m!r}"
            assert x.grad._data.tolist() == [2.0, 2.0, 2.0], f"call {i}: {x.grad._data.tolist()}"
    finally:
        torch._dynamo.reset()


class _DeclaredBits(opaque_subclass.OpaqueBase):
    """A value opaque declaring the attribute compiled code reads (``subclasses.Config`` declares none)."""

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _DeclaredBits) and other.bits == self.bits

    def __hash__(self) -> int:
        return hash(self.bits)

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        return f"_DeclaredBits({self.bits})", {"_DeclaredBits": _DeclaredBits}


opaque_subclass.register_opaque(_DeclaredBits, kind="value", members={"bits": opaque_subclass.Member.USE_REAL})


def _scaled_by_context_bits(make: Callable[[int], object]) -> None:
    """``x * x._ctx.bits`` with a value opaque in the flatten context: each call's value (one
    compilation per value, the value opaque's equality guard)."""
    f = torch.compile(lambda x: x * x._ctx.bits, backend="aot_eager", fullgraph=True)
    for bits in (3, 3, 5):
        out = f(MeshTensor(torch.ones(2), Mesh(), ctx=make(bits)))
        assert out._data.tolist() == [float(bits)] * 2, f"bits={bits}: {out._data.tolist()}"


def test_member_of_a_value_opaque_in_the_context():
    from subclasses import Config

    torch._dynamo.reset()
    try:
        _scaled_by_context_bits(_DeclaredBits)  # declared: compiles on every release
        torch._dynamo.reset()
        if not BACKPORT:
            _scaled_by_context_bits(Config)  # torch 2.12+ reads an undeclared one as a constant
            return
        # torch 2.11 compiles only declared members of a value opaque: the library's error names the fix
        with pytest.raises(opaque_subclass.OpaqueMemberError) as info:
            _scaled_by_context_bits(Config)
        msg = str(info.value)
        assert "'bits' of the value opaque subclasses.Config (at L['x']._ctx.bits" in msg, msg
        assert 'members={"bits": opaque_subclass.Member.USE_REAL}' in msg, msg
        torch._dynamo.reset()
        with PATCH_SET.suspended("torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr"):
            assert_fails_as(
                lambda: _scaled_by_context_bits(Config),
                StockFailure(
                    _DYNAMO.InternalTorchDynamoError,
                    r"^UnsafeScriptObjectError: Attempted to access unregistered member on an OpaqueObject",
                ),
            )
    finally:
        torch._dynamo.reset()


def _gauge_scaled(read_from_output: bool, member: str) -> None:
    """``y * g.offset`` (or ``g.doubled()``) with ``g`` the gauge of the input ``x`` or of
    ``y = x * 2``: each call's gauge value."""
    from subclasses import Gauge, GaugeTensor

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        g = (y if read_from_output else x)._gauge
        return y * (g.offset if member == "offset" else g.doubled())

    f = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for offset in (3, 5):
        out = f(GaugeTensor(torch.ones(2), Gauge(1, offset)))
        want = 2.0 * (offset if member == "offset" else 2 * offset)
        assert out._data.tolist() == [want] * 2, f"offset={offset}: {out._data.tolist()}, expected {want}"


@pytest.mark.parametrize("member", ["offset", "doubled"])
def test_members_of_an_opaque_of_a_subclass_made_in_the_graph(member):
    """The input's gauge: each call's value on every release. The gauge of a subclass computed in
    the compiled function has no source: on torch 2.11 the library's error naming that fix (torch
    2.12 - 2.15 compile a USE_REAL value of it unguarded, and fail inside Dynamo on an INLINED
    method: not asserted here)."""
    torch._dynamo.reset()
    try:
        _gauge_scaled(read_from_output=False, member=member)
        torch._dynamo.reset()
        if not BACKPORT:
            return
        with pytest.raises(opaque_subclass.OpaqueMemberError) as info:
            _gauge_scaled(read_from_output=True, member=member)
        msg = str(info.value)
        assert f"compiled code uses {member!r}" in msg and "read from attribute '_gauge' of a tensor subclass" in msg
        assert f"(x._gauge.{member}, " in msg, msg
    finally:
        torch._dynamo.reset()


@needs_backport
def test_saved_values_step_returns_what_torchs_walk_returns():
    """The run-time module's ``runtime_unwrap_tensor_subclasses`` (the backport's): for saved
    values of classes that cannot be subclasses, a new list of the same objects; for anything
    else (a traceable subclass, a tensor subclass, an object claiming another class, symbolic
    sizes to append) torch's walk, so the same result in every case."""
    from torch._functorch._aot_autograd import runtime_wrappers, subclass_utils
    from torch.testing._internal.two_tensor import TwoTensor

    ours = runtime_wrappers.runtime_unwrap_tensor_subclasses
    torchs = subclass_utils.runtime_unwrap_tensor_subclasses
    assert ours is not torchs and ours.__module__ == "opaque_subclass.backport.runtime"

    class ClaimsTensor:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return torch.Tensor

    t = torch.ones(2)
    cases = [
        [t, 3, 2.5, None, Mesh("saved-a"), Mesh("saved-b")],
        [t, TwoTensor(t, t * 2), Mesh("saved-c")],
        [torch.nn.Parameter(t), t],
        [ClaimsTensor(), t],
        [],
    ]
    for values in cases:
        got = ours(values, append_symints=False)
        want = torchs(values, append_symints=False)
        assert got is not values
        assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True)), values
    assert len(ours(cases[1], append_symints=False)) == 4  # the TwoTensor flattened by torch's walk
