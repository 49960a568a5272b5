"""describe_args, unwrap/wrap (inference, joint, saved activations,
symbolic sizes), the generated fast path against the generic one."""

import pickle

import pytest
import torch
from subclasses import Mesh, MeshTensor, MultiOpaque, PlainPair, Stream, nested
from torch._dynamo.source import LocalSource
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

import opaque_subclass as osc
from opaque_subclass.core import codegen
from opaque_subclass.core.codegen import DEFAULT_CHECKS, RuntimeChecks, compiled_unwrap, compiled_wrap
from opaque_subclass.core.spec import rebuild as build


def _rt(metas):
    return [m.runtime_safe() if isinstance(m, osc.SubclassLayout) else m for m in metas]


def test_metas_number_slots_across_arguments():
    m = Mesh()
    args = [torch.ones(1), MeshTensor(torch.ones(2), m), 7, m, nested(2)]
    metas = osc.describe_args(args)
    assert metas[0] == osc.TensorSlot(0)
    assert isinstance(metas[1], osc.SubclassLayout) and metas[1].flat_tensor_start_idx == 1
    assert metas[2] == osc.TensorSlot(3)
    assert metas[3] == osc.OpaqueSlot(4, None, Mesh)
    assert metas[4].flat_tensor_start_idx == 5 and metas[4].arg_count == 3
    flat = osc.unwrap_args(args, is_joint_structure=False)
    assert len(flat) == 8 and flat[2] is m and flat[3] == 7 and flat[4] is m
    out = osc.wrap_args(flat, subclass_metas=_rt(metas), is_runtime=True)
    assert out[2] == 7 and out[3] is m and out[1]._mesh is m and out[4]._data._mesh is args[4]._data._mesh


def test_runtime_wrap_carries_new_opaques():
    metas = _rt(osc.describe_args([MeshTensor(torch.ones(2), Mesh("compile"))]))
    for i in range(5):
        runtime_mesh = Mesh(f"call{i}")
        (out,) = osc.wrap_args([torch.full((2,), float(i)), runtime_mesh], subclass_metas=metas, is_runtime=True)
        assert out._mesh is runtime_mesh and out._data[0].item() == i


def test_generated_and_generic_paths_agree():
    x = MeshTensor(MultiOpaque(torch.randn(2), torch.randn(2), Mesh(), Stream()), Mesh(), ctx=("k", 1))
    (meta,) = osc.describe_args([x])
    leaves = list(compiled_unwrap(meta, False)(x))
    generic = osc.unwrap_args([x], is_joint_structure=False)
    assert len(leaves) == 5 and all(a is b for a, b in zip(leaves, generic, strict=True))
    a = compiled_wrap(meta.runtime_safe())(leaves)
    b = build(meta, leaves, is_runtime=True)
    leaves_a = osc.unwrap_args([a], is_joint_structure=False)
    leaves_b = osc.unwrap_args([b], is_joint_structure=False)
    assert len(leaves_a) == 5 and all(p is q for p, q in zip(leaves_a, leaves_b, strict=True))
    assert type(a._data) is type(b._data) is MultiOpaque
    assert a._ctx == b._ctx == ("k", 1)


def test_generated_code_is_cached_per_meta():
    (meta,) = _rt(osc.describe_args([MeshTensor(torch.ones(2), Mesh())]))
    assert compiled_wrap(meta) is compiled_wrap(meta)
    assert compiled_unwrap(meta, False) is compiled_unwrap(meta, False)


def test_checks_are_a_parameter_of_generation_and_of_its_cache_key():
    """Which checks a generated function makes is passed, not read from a global: each
    setting gets its own function, cached under its own key, and the default one is
    the one the run-time helpers use."""
    (meta,) = _rt(osc.describe_args([MeshTensor(torch.ones(2), Mesh())]))
    unchecked = RuntimeChecks(opaque_slots=False)
    checked_unwrap, checked_wrap = compiled_unwrap(meta, False), compiled_wrap(meta)
    assert compiled_unwrap(meta, False, unchecked) is not checked_unwrap
    assert compiled_unwrap(meta, False, unchecked) is compiled_unwrap(meta, False, RuntimeChecks(opaque_slots=False))
    assert compiled_unwrap(meta, False, DEFAULT_CHECKS) is checked_unwrap
    assert compiled_wrap(meta, checks=unchecked) is not checked_wrap
    stray = object()  # not a registered opaque, in the opaque slot
    bad = MeshTensor(torch.ones(2), stray)
    with pytest.raises(osc.OpaqueTypeError, match=r"x\._mesh is an opaque slot .* got object"):
        checked_unwrap(bad)
    assert compiled_unwrap(meta, False, unchecked)(bad)[1] is stray
    with pytest.raises(osc.OpaqueTypeError, match=r"opaque"):
        osc.unwrap_args([bad], is_joint_structure=False, subclass_metas=[meta])
    # no module-level setting to change: nothing public in codegen is a mutable container
    public = {k: v for k, v in vars(codegen).items() if not k.startswith("_")}
    assert not [k for k, v in public.items() if isinstance(v, (dict, list, set))], public.keys()
    with pytest.raises(AttributeError):
        DEFAULT_CHECKS.names = False  # type: ignore[misc]


class _OddNames(torch.Tensor):
    """Attribute names that are not Python identifiers force the generic path."""

    @staticmethod
    def __new__(cls, data, mesh):
        r = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype)
        setattr(r, "inner-data", data)
        setattr(r, "class", mesh)
        return r

    def __repr__(self):
        return "_OddNames()"

    def __tensor_flatten__(self):
        return ["inner-data", "class"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return _OddNames(inner["inner-data"], inner["class"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def test_non_identifier_attribute_names_use_generic_path():
    m = Mesh()
    x = _OddNames(torch.ones(3), m)
    metas = _rt(osc.describe_args([x]))
    flat = osc.unwrap_args([x], is_joint_structure=False, subclass_metas=metas)
    assert flat[1] is m
    (y,) = osc.wrap_args(flat, subclass_metas=metas, is_runtime=True)
    assert getattr(y, "class") is m


def test_joint_structure_round_trip():
    pm, tm = Mesh("p"), Mesh("t")
    primals = [MeshTensor(torch.ones(2), pm), torch.zeros(1)]
    tangents = [MeshTensor(torch.ones(2), tm)]
    p_metas, t_metas = osc.describe_args(primals), osc.describe_args(tangents)
    flat = osc.unwrap_args((primals, tangents), is_joint_structure=True)
    assert isinstance(flat, tuple) and len(flat[0]) == 3 and flat[1][1] is tm
    by_spec = osc.unwrap_args((primals, tangents), is_joint_structure=True, subclass_metas=(p_metas, t_metas))
    assert all(a is b for a, b in zip(flat[0] + flat[1], by_spec[0] + by_spec[1], strict=True))
    wp, wt = osc.wrap_args_maybe_joint(
        flat, is_joint_structure=True, inp_metas=_rt(p_metas), tangent_metas=_rt(t_metas), is_runtime=True
    )
    assert wp[0]._mesh is pm and wt[0]._mesh is tm and wp[1] is primals[1]
    inference = osc.wrap_args_maybe_joint(flat[0], is_joint_structure=False, inp_metas=_rt(p_metas), is_runtime=True)
    assert inference[0]._mesh is pm


def test_saved_activations_pass_through():
    m = Mesh()
    outs = [MeshTensor(torch.ones(2), m), torch.ones(3)]
    metas = _rt(osc.describe_args(outs))
    flat = osc.unwrap_args(outs, is_joint_structure=False)
    acts = [torch.zeros(4), m]
    wrapped = osc.wrap_args(flat + acts, subclass_metas=metas, num_fw_outs_saved_for_bw=2, is_runtime=True)
    assert len(wrapped) == 4 and wrapped[0]._mesh is m and wrapped[2] is acts[0] and wrapped[3] is m
    empty = osc.wrap_args(flat, subclass_metas=metas, num_fw_outs_saved_for_bw=0, is_runtime=True)
    assert len(empty) == 2


def _symbolic(shape_env_mode, real, name):
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (real.dim() - 1))
    return shape_env_mode.from_tensor(real, source=LocalSource(name), symbolic_context=ctx)


def _check_traced_rebuild(traced, fake, flat) -> None:
    """The trace-time wrap of ``flat`` (the leaves of ``fake``, a MeshTensor of a
    MeshTensor with a symbolic first size) rebuilt ``fake`` exactly: the same
    inner fake tensor, each level's own mesh from its slot (the objects, not
    equal ones), and at each level the symbolic size of ``fake`` (MeshTensor's
    unflatten takes it from its inner tensor). The same on torch 2.11 - 2.15
    (measured): a ``SymInt`` is a new Python object on each ``.shape[0]``, so
    the symbol is compared by its ``SymNode``, which is shared."""
    assert type(traced) is MeshTensor and type(traced._data) is MeshTensor, type(traced)
    assert traced._data._data is flat[0] is fake._data._data
    assert traced._data._mesh is flat[1] is fake._data._mesh, traced._data._mesh
    assert traced._mesh is flat[3] is fake._mesh, traced._mesh
    assert isinstance(traced.shape[0], torch.SymInt), traced.shape
    assert traced.shape[0].node is fake.shape[0].node, (traced.shape, fake.shape)
    assert traced._data.shape[0].node is fake._data.shape[0].node, (traced._data.shape, fake._data.shape)
    assert traced.shape[1] == 3 and traced.stride() == (3, 1)


def test_symbolic_sizes_take_slots_and_are_read_back_at_run_time():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    m_in, m_out = Mesh("in"), Mesh("out")
    real_inner = torch.randn(4, 3)
    with mode:
        inner = _symbolic(mode, real_inner, "x")
        fake = MeshTensor(MeshTensor(inner, m_in), m_out)
    (meta,) = osc.describe_args([fake], count_symints=True)
    assert meta.original_subclass is fake
    assert meta.size_placeholders == (0,) and meta.stride_placeholders == ()
    assert meta.arg_count == 5  # tensor, inner mesh, inner size, outer mesh, outer size
    paths = [p for p, _ in osc.iter_slots(meta, "x")]
    assert paths == ["x._data._data", "x._data._mesh", "x._data.size()[0]", "x._mesh", "x.size()[0]"]
    flat = osc.unwrap_args([fake], is_joint_structure=False, append_symints=True)
    assert isinstance(flat[0], FakeTensor) and isinstance(flat[2], torch.SymInt) and flat[1] is m_in
    with mode:
        (traced,) = osc.wrap_args(flat, subclass_metas=[meta], is_runtime=False)
    _check_traced_rebuild(traced, fake, flat)

    safe = meta.runtime_safe()
    assert safe.outer_size == (None, 3) and safe.original_subclass is None and safe.arg_count == 5
    assert pickle.loads(pickle.dumps(safe)) == safe
    m_rt = Mesh("rt")
    real = MeshTensor(MeshTensor(torch.randn(7, 3), m_rt), m_out)
    rflat = osc.unwrap_args([real], is_joint_structure=False, append_symints=True, subclass_metas=[safe])
    assert rflat[2] == 7 and rflat[4] == 7 and rflat[1] is m_rt
    (out,) = osc.wrap_args(rflat, subclass_metas=[safe], is_runtime=True)
    assert out.shape == (7, 3) and out._data.shape == (7, 3) and out._data._mesh is m_rt


def test_the_traced_rebuild_check_refuses_a_wrong_mesh_or_symbol():
    """:func:`_check_traced_rebuild` accepts the right trace-time rebuild and
    refuses one whose outer mesh is another object (which the former check's
    ``or str(size) == str(size)`` branch accepted) and a wrapper of the right
    leaves whose outer size is another symbol."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    real_inner, real_other = torch.randn(4, 3), torch.randn(5, 3)
    with mode:
        fake = MeshTensor(MeshTensor(_symbolic(mode, real_inner, "x"), Mesh("in")), Mesh("out"))
        other = _symbolic(mode, real_other, "y")
    (meta,) = osc.describe_args([fake], count_symints=True)
    flat = osc.unwrap_args([fake], is_joint_structure=False, append_symints=True)

    def traced(leaves):
        with mode:
            return osc.wrap_args(leaves, subclass_metas=[meta], is_runtime=False)[0]

    _check_traced_rebuild(traced(flat), fake, flat)
    wrong_mesh = traced([*flat[:3], Mesh("out"), flat[4]])
    assert wrong_mesh._mesh is not fake._mesh and str(wrong_mesh.shape[0]) == str(fake.shape[0])
    with pytest.raises(AssertionError):
        _check_traced_rebuild(wrong_mesh, fake, flat)
    right = traced(flat)
    with mode:
        wrong_symbol = MeshTensor(right._data, right._mesh, outer=other)
    assert str(wrong_symbol.shape[0]) != str(fake.shape[0])
    with pytest.raises(AssertionError):
        _check_traced_rebuild(wrong_symbol, fake, flat)


def test_trace_time_wrap_mirrors_autograd_meta():
    mode = FakeTensorMode()
    real_inner = torch.randn(3)
    with mode:
        inner = mode.from_tensor(real_inner)
        fake = MeshTensor(inner, Mesh())
        fake.requires_grad_(True)
    (meta,) = osc.describe_args([fake])
    flat = osc.unwrap_args([fake], is_joint_structure=False)
    with mode:
        (rebuilt,) = osc.wrap_args(flat, subclass_metas=[meta], is_runtime=False)
    assert rebuilt.requires_grad


def test_real_tensors_are_not_kept_in_metas():
    (meta,) = osc.describe_args([MeshTensor(torch.ones(2), Mesh())])
    assert meta.original_subclass is None


def test_memory_format_recorded():
    x = PlainPair(torch.randn(1, 2, 3, 3).contiguous(memory_format=torch.channels_last), torch.randn(1, 2, 3, 3))
    (meta,) = osc.describe_args([x], with_memory_format=True)
    assert meta.attrs["a"].memory_format == torch.channels_last
    assert meta.attrs["b"].memory_format == torch.contiguous_format


def test_meta_equality_and_hash():
    a = osc.describe_args([MeshTensor(torch.ones(2), Mesh())])[0]
    b = osc.describe_args([MeshTensor(torch.zeros(2), Mesh())])[0]
    assert a == b and hash(a) == hash(b)
    c = osc.describe_args([MeshTensor(torch.zeros(3), Mesh())])[0]
    assert a != c


@pytest.mark.parametrize("k", [1, 8, 64])
def test_many_arguments(k):
    meshes = [Mesh(str(i)) for i in range(k)]
    args = [MeshTensor(torch.full((2,), float(i)), meshes[i]) for i in range(k)]
    metas = _rt(osc.describe_args(args))
    flat = osc.unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
    assert len(flat) == 2 * k
    out = osc.wrap_args(flat, subclass_metas=metas, is_runtime=True)
    assert all(o._mesh is m and o._data[0].item() == i for i, (o, m) in enumerate(zip(out, meshes, strict=True)))


@pytest.mark.parametrize("with_metas", [False, True], ids=["walk", "metas"])
@pytest.mark.parametrize("joint", [False, True], ids=["flat", "joint"])
def test_unwrap_names_a_bad_argument_the_same_with_and_without_metas(with_metas, joint):
    """unwrap_args names a bad attribute by the argument's place,
    ``args[1]._data._data`` (``primals[1]...``, ``tangents[0]...`` for a joint
    structure), with metas (the generated unwrap, cached per meta) as without
    (the validating walk); the generated unwrap's own name ``x`` does not leak."""
    good, broken = nested(2), nested(2)
    metas = osc.describe_args([good, good])
    broken._data._data = None
    args: object = [good, broken]
    subclass_metas: object = metas if with_metas else None
    where = "args[1]._data._data"
    if joint:
        args, where = ([good, broken], [good]), "primals[1]._data._data"
        subclass_metas = (metas, metas[:1]) if with_metas else None
    for _ in range(2):  # the generated unwrap is cached after the first call: same name again
        with pytest.raises(TypeError) as info:
            osc.unwrap_args(args, is_joint_structure=joint, subclass_metas=subclass_metas)
        msg = str(info.value)
        assert where in msg and "x._data" not in msg and "NoneType" in msg and "Fix:" in msg, msg
    if joint:  # and a bad tangent is named as one
        args = ([good], [broken])
        subclass_metas = (metas[:1], metas[:1]) if with_metas else None
        with pytest.raises(TypeError, match=r"tangents\[0\]\._data\._data"):
            osc.unwrap_args(args, is_joint_structure=True, subclass_metas=subclass_metas)
    if with_metas:  # another type than the metas were made from: the argument is named too
        with pytest.raises(TypeError, match=r"expected a subclasses\.MeshTensor at args\[1\] .*got torch\.Tensor"):
            osc.unwrap_args([good, torch.ones(2)], is_joint_structure=False, subclass_metas=metas)


@pytest.mark.parametrize("bad", [3, None, 2.5, "t"])
def test_fast_paths_refuse_a_non_tensor_in_a_tensor_slot(bad):
    """The generated unwrap and wrap (per subclass, and per argument list) check
    every tensor slot: a value that is not a tensor raises a TypeError naming
    the subclass, the attribute path and the type, instead of reaching a graph."""
    from opaque_subclass.core.codegen import ArgumentsPlan

    m = Mesh()
    metas = osc.describe_args([nested(2)])
    broken = nested(2)
    broken._data._data = bad
    kind = type(bad).__name__
    with pytest.raises(TypeError, match=rf"MeshTensor: args\[0\]\._data\._data is a tensor slot.*got {kind}\b.*Fix:"):
        osc.unwrap_args([broken], is_joint_structure=False, subclass_metas=metas)
    with pytest.raises(TypeError, match=rf"args\[0\]\._data\._data is a tensor slot.*got {kind}\b"):
        ArgumentsPlan(metas).unwrap([broken])
    rt = _rt(metas)
    width = rt[0].arg_count
    flat = [bad] + [m] * (width - 1)
    with pytest.raises(
        TypeError,
        match=rf"wrap of .*MeshTensor: flat slot 0 rebuilds the tensor attribute x\._data\._data, got {kind}\b.*Fix:",
    ):
        osc.wrap_args(flat, subclass_metas=rt, is_runtime=True)
    with pytest.raises(
        TypeError, match=rf"flat slot 0 rebuilds the tensor attribute args\[0\]\._data\._data, got {kind}\b"
    ):
        ArgumentsPlan(rt).wrap(flat)


def test_fast_paths_accept_tensor_subtypes_in_tensor_slots():
    """Parameters (and other Tensor subtypes) pass the slot check."""
    m = Mesh()
    x = MeshTensor(torch.nn.Parameter(torch.ones(2)), m)
    metas = osc.describe_args([x])
    flat = osc.unwrap_args([x], is_joint_structure=False, subclass_metas=metas)
    assert flat[0] is x._data and flat[1] is m
    (out,) = osc.wrap_args(flat, subclass_metas=_rt(metas), is_runtime=True)
    assert out._data is x._data and out._mesh is m
