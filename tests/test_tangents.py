"""unwrap_tangent: opaque slots passed through, tensor slots coerced."""

import pytest
import torch
from scenarios import frames_started, runs_of_torchs_tangent_function
from subclasses import Mesh, MeshTensor, MultiOpaque, PlainPair, Stream

import opaque_subclass as osc


def test_plain_tangent_coerced_to_forward_memory_format():
    out = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    (meta,) = osc.describe_args([out], with_memory_format=True)
    tangent = torch.randn(2, 3, 4, 4)
    new, leaves = osc.unwrap_tangent(tangent, meta)
    assert (new.is_contiguous(memory_format=torch.channels_last) and leaves == [new]) or leaves[0] is new
    assert torch.equal(new, tangent)


def test_subclass_tangent_keeps_opaque_and_coerces_inner_layout():
    fw = MeshTensor(torch.randn(4, 3), Mesh("fw"))
    (meta,) = osc.describe_args([fw], with_memory_format=True)
    tangent_mesh = Mesh("tangent")
    inner = torch.randn(3, 4).t()  # non-contiguous
    tangent = MeshTensor(inner, tangent_mesh)
    new, leaves = osc.unwrap_tangent(tangent, meta)
    assert len(leaves) == 2 and leaves[1] is tangent_mesh
    assert leaves[0].is_contiguous() and torch.equal(leaves[0], inner)
    assert new._data is leaves[0] and new._mesh is tangent_mesh


def test_nested_tangent_leaves_line_up_with_slots():
    m, s = Mesh(), Stream()
    fw = MeshTensor(MultiOpaque(torch.randn(2), torch.randn(2), m, s), m)
    (meta,) = osc.describe_args([fw], with_memory_format=True)
    tm, ts = Mesh("t"), Stream(9)
    tangent = MeshTensor(MultiOpaque(torch.ones(2), torch.ones(2), tm, ts), tm)
    _, leaves = osc.unwrap_tangent(tangent, meta)
    kinds = ["opaque" if isinstance(slot, osc.OpaqueSlot) else "tensor" for _, slot in osc.iter_slots(meta)]
    assert kinds == ["tensor", "tensor", "opaque", "opaque", "opaque"]
    assert leaves[2] is tm and leaves[3] is ts and leaves[4] is tm


def test_non_tensor_tangent_passes_through():
    (meta,) = osc.describe_args([Mesh()])
    assert osc.unwrap_tangent(None, meta) == (None, [None])


def test_tensor_for_opaque_output_is_rejected():
    (meta,) = osc.describe_args([Mesh()])
    with pytest.raises(TypeError, match=r"tangent 'tangent'.*subclasses.Mesh opaque, which has no tangent"):
        osc.unwrap_tangent(torch.ones(1), meta)


def test_type_mismatch_without_coercion_names_types_and_fix():
    (meta,) = osc.describe_args([MeshTensor(torch.randn(2), Mesh())], with_memory_format=True)
    with pytest.raises(TypeError) as info:
        osc.unwrap_tangent(torch.randn(2), meta, name="grad_out[0]")
    msg = str(info.value)
    assert "'grad_out[0]' is a torch.Tensor" in msg and "subclasses.MeshTensor" in msg
    assert "__coerce_same_metadata_as_tangent__" in msg


class _Coercible(PlainPair):
    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        if expected_type is MeshTensor:
            return MeshTensor(self.a, Mesh("coerced"), ctx=expected_metadata)
        return None


def test_coercion_hook_is_used():
    (meta,) = osc.describe_args([MeshTensor(torch.randn(2), Mesh(), ctx="c")], with_memory_format=True)
    new, leaves = osc.unwrap_tangent(_Coercible(torch.ones(2), torch.ones(2)), meta)
    assert type(new) is MeshTensor and new._ctx == "c" and leaves[1].name == "coerced"


def test_context_mismatch_without_hook():
    (meta,) = osc.describe_args([MeshTensor(torch.randn(2), Mesh(), ctx="fw")], with_memory_format=True)
    with pytest.raises(TypeError, match="with flatten context 'bw'.*with context 'fw'"):
        osc.unwrap_tangent(MeshTensor(torch.randn(2), Mesh(), ctx="bw"), meta)


def test_non_opaque_in_opaque_slot_of_tangent():
    (meta,) = osc.describe_args([MeshTensor(torch.randn(2), Mesh())], with_memory_format=True)
    bad = MeshTensor(torch.randn(2), Mesh())
    bad._mesh = 5
    with pytest.raises(TypeError, match=r"tangent 'tangent._mesh': expected a reference opaque in this slot, got int"):
        osc.unwrap_tangent(bad, meta)


def _nested(depth, data, tag):
    """``data`` in ``depth`` levels of ``MeshTensor``, each on a mesh of its own."""
    t = data
    for level in range(depth):
        t = MeshTensor(t, Mesh(f"{tag}{level}"))
    return t


@pytest.mark.parametrize("depth", [1, 2])
def test_compiled_backward_takes_a_ready_tangents_leaves_without_torchs_processing(depth):
    # A tangent of the output's type, context, names and layout needs nothing from torch's
    # per-tangent function (about 6 us a tangent): the fix reads its leaves in one pass.
    fn = torch.compile(lambda a, b: (a * 2, b + 1), backend="aot_eager", fullgraph=True)
    xs = [_nested(depth, torch.randn(4), "x").requires_grad_(), _nested(depth, torch.randn(4), "y").requires_grad_()]
    outs = fn(*xs)
    tangents = [_nested(depth, torch.full((4,), 3.0), "t"), _nested(depth, torch.full((4,), 5.0), "u")]
    grads = []
    calls = runs_of_torchs_tangent_function(lambda: grads.extend(torch.autograd.grad(outs, xs, tangents)))
    assert calls == 0
    inner = list(grads)
    for _ in range(depth):
        inner = [g._data for g in inner]
    assert torch.equal(inner[0], torch.full((4,), 6.0)) and torch.equal(inner[1], torch.full((4,), 5.0))
    for g, x in zip(grads, xs, strict=True):  # a gradient takes its input's opaque (docs/backport.md)
        assert type(g) is MeshTensor and g._mesh is x._mesh


def test_compiled_backward_leaves_a_tangent_to_coerce_to_torch():
    # A tangent whose inner tensor is laid out otherwise than the output's goes torch's way
    # (coerced to the expected layout); the gradient equals eager's.
    fn = torch.compile(lambda a: a * 2, backend="aot_eager", fullgraph=True)
    x = MeshTensor(torch.randn(3, 4), Mesh("x")).requires_grad_()
    out = fn(x)
    inner = torch.arange(12.0).reshape(4, 3).t()  # non-contiguous, same shape
    tangent = MeshTensor(inner, Mesh("t"))
    grads = []
    calls = runs_of_torchs_tangent_function(lambda: grads.extend(torch.autograd.grad(out, x, tangent)))
    assert calls >= 1
    (grad,) = grads
    assert torch.equal(grad._data, inner * 2) and grad._mesh is x._mesh


@pytest.mark.parametrize("depth", [1, 2])
def test_a_ready_tangent_is_read_by_code_generated_for_its_output(depth):
    # Per backward call, a ready tangent is read by straight-line code generated once per
    # output (its names, context, slot kinds and layouts bound in), not by the general walk.
    fn = torch.compile(lambda a, b: (a * 2, b + 1), backend="aot_eager", fullgraph=True)
    for call in range(3):
        xs = [
            _nested(depth, torch.randn(4), f"x{call}").requires_grad_(),
            _nested(depth, torch.randn(4), f"y{call}").requires_grad_(),
        ]
        outs = fn(*xs)
        tangents = [
            _nested(depth, torch.full((4,), 3.0), f"t{call}"),
            _nested(depth, torch.full((4,), 5.0), f"u{call}"),
        ]
        grads = []
        seen = frames_started(
            lambda g=grads, o=outs, i=xs, t=tangents: g.extend(torch.autograd.grad(o, i, t)), "read_tangent", "read"
        )
        if call > 0:  # the first call generates the readers
            assert seen == {"read_tangent": 2, "read": 0}
        inner = list(grads)
        for _ in range(depth):
            inner = [g._data for g in inner]
        assert torch.equal(inner[0], torch.full((4,), 6.0)) and torch.equal(inner[1], torch.full((4,), 5.0))
        for g, x in zip(grads, xs, strict=True):
            assert type(g) is MeshTensor and g._mesh is x._mesh


def test_a_tangent_the_generated_read_cannot_take_goes_the_general_way():
    # An inner tensor laid out otherwise than the output's: the generated read declines, the
    # general one hands the tangent to torch (which coerces it), and the gradient is eager's.
    fn = torch.compile(lambda a: a * 2, backend="aot_eager", fullgraph=True)
    for tag in ("a", "b"):
        x = MeshTensor(torch.randn(3, 4), Mesh(tag)).requires_grad_()
        out = fn(x)
        inner = torch.arange(12.0).reshape(4, 3).t()  # non-contiguous, same shape
        grads = []
        tangent = MeshTensor(inner, Mesh("t"))
        seen = frames_started(
            lambda g=grads, o=out, i=x, t=tangent: g.extend(torch.autograd.grad(o, i, t)),
            "read_tangent",
            "read",
        )
        assert seen == {"read_tangent": 1, "read": 1}
        (grad,) = grads
        assert torch.equal(grad._data, inner * 2) and grad._mesh is x._mesh


def test_generated_tangent_readers_outlive_disable_and_enable():
    # The readers are kept per output meta, not per installation of the fix: switching the
    # library off and on (as a benchmark or a test does) does not generate them again.
    import opaque_subclass as osc

    fn = torch.compile(lambda a: a * 2, backend="aot_eager", fullgraph=True)
    x = MeshTensor(torch.randn(3), Mesh("x")).requires_grad_()
    out = fn(x)
    torch.autograd.grad(out, x, MeshTensor(torch.ones(3), Mesh("t")))  # generates the reader
    osc.disable()
    osc.enable()
    x = MeshTensor(torch.randn(3), Mesh("y")).requires_grad_()
    out = fn(x)
    grads = []
    tangent = MeshTensor(torch.ones(3), Mesh("u"))
    seen = frames_started(
        lambda: grads.extend(torch.autograd.grad(out, x, tangent)), "read_tangent", "reader_for", "read"
    )
    assert seen == {"read_tangent": 1, "reader_for": 0, "read": 0}
    assert torch.equal(grads[0]._data, torch.full((3,), 2.0)) and grads[0]._mesh is x._mesh
