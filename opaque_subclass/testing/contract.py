"""A reusable contract test for opaque-attribute subclasses.

Subclass :class:`OpaqueSubclassContract` in a pytest module, setting ``SUBCLASS``
and ``FACTORY`` (a zero-argument callable returning a fresh instance)::

    from opaque_subclass.testing import OpaqueSubclassContract

    class TestMeshTensor(OpaqueSubclassContract):
        SUBCLASS = MeshTensor
        FACTORY = staticmethod(lambda: MeshTensor(torch.randn(4), MESH))

The compile and export checks need ``x * 2`` and ``.sum()`` (the default rule
of :class:`~opaque_subclass.OpaqueSubclass` has them). Name the class ``Test...``
for pytest to collect it; the base is not collected.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from opaque_subclass.core.aliasing import OpaqueAliasPattern, opaque_alias_pattern
from opaque_subclass.core.flatten import describe_args, flatten_subclass, is_wrapper_subclass, unflatten_subclass
from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.core.runtime import unwrap_args, unwrap_tangent, wrap_args
from opaque_subclass.core.spec import OpaqueSlot, SubclassLayout, iter_slots
from opaque_subclass.modules.parametrization import unwrap_subclass_parameters

__all__ = ["OpaqueSubclassContract", "assert_same_leaves"]


def assert_same_leaves(actual: list[Any], expected: list[Any]) -> None:
    """Opaques identical (``is``), tensors equal in type, shape, dtype and values."""
    assert len(actual) == len(expected), f"{len(actual)} leaves != {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"leaf {i}: {type(a).__qualname__} is not a tensor"
            assert type(a) is type(e) and a.shape == e.shape and a.dtype == e.dtype, f"leaf {i} differs"
            assert torch.equal(a, e), f"leaf {i}: values differ"
        else:
            assert a is e, f"leaf {i}: {a!r} is not the same object as {e!r}"


class OpaqueSubclassContract:
    """Round-trip and run-time checks every opaque-attribute subclass must pass."""

    SUBCLASS: ClassVar[type]
    FACTORY: ClassVar[Callable[[], torch.Tensor]]
    BACKEND: ClassVar[str] = "aot_eager"

    def make(self) -> torch.Tensor:
        x = type(self).FACTORY()
        assert type(x) is type(self).SUBCLASS, (
            f"FACTORY returned {type(x).__qualname__}, not {type(self).SUBCLASS.__qualname__}"
        )
        assert is_wrapper_subclass(x), f"FACTORY returned {type(x).__qualname__}, not a wrapper subclass"
        return x

    def _opaques(self, x: torch.Tensor) -> list[Any]:
        leaves, _ = flatten_subclass(x)
        return [v for v in leaves if not isinstance(v, torch.Tensor)]

    def _assert_same_opaques(self, actual: torch.Tensor, expected: torch.Tensor, failure: str) -> None:
        """``actual`` holds the very opaques of ``expected``: as many, in the same order."""
        got, want = self._opaques(actual), self._opaques(expected)
        assert len(got) == len(want), f"{failure}: {len(got)} opaque(s) {got!r}, expected {len(want)} {want!r}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a is b, f"{failure}: opaque {i} is {a!r}, not the same object as {b!r}"

    def _compile(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
        import torch._dynamo
        import torch._dynamo.testing

        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounterWithBackend(self.BACKEND)
        return torch.compile(fn, backend=counter, fullgraph=True), counter

    def test_compile_forward_keeps_runtime_opaques(self) -> None:
        f, counter = self._compile(lambda x: x * 2)
        for _ in range(3):
            x = self.make()
            out = f(x)
            assert type(out) is type(x)
            self._assert_same_opaques(out, x, "output lost the input's opaques")
        assert counter.frame_count == 1, f"{counter.frame_count} compilations for 3 calls"

    def test_compile_backward(self) -> None:
        f, _ = self._compile(lambda x: (x * 2).sum())
        for _ in range(2):
            x = self.make().requires_grad_(True)
            f(x).backward()
            assert type(x.grad) is type(x)
            self._assert_same_opaques(x.grad, x, "x.grad does not carry x's opaques")

    def test_export_keeps_runtime_opaques(self) -> None:
        class Double(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * 2

        program = torch.export.export(Double(), (self.make(),), strict=False)
        x = self.make()
        out = program.module()(x)
        assert type(out) is type(x)
        self._assert_same_opaques(out, x, "exported program lost the input's opaques")

    def test_parametrization_keeps_opaques(self) -> None:

        module = torch.nn.Module()
        x = self.make()
        module.p = torch.nn.Parameter(x, requires_grad=False)
        unwrap_subclass_parameters(module)
        rebuilt = module.p
        assert type(rebuilt) is type(x)
        self._assert_same_opaques(rebuilt, x, "module.p does not hold the original opaques")
        assert all(type(v) in (torch.Tensor, torch.nn.Parameter) for v in module.state_dict().values())

    def test_compiled_autograd(self) -> None:
        import torch._dynamo.compiled_autograd

        f, _ = self._compile(lambda x: (x * 3).sum())
        x = self.make().requires_grad_(True)
        loss = f(x)
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend=self.BACKEND)):
            loss.backward()
        assert type(x.grad) is type(x)
        self._assert_same_opaques(x.grad, x, "x.grad (compiled autograd) does not carry x's opaques")

    def test_flatten_round_trip(self) -> None:
        x = self.make()
        leaves, spec = flatten_subclass(x)
        assert isinstance(spec, SubclassLayout)
        assert spec.arg_count == len(leaves) == spec.num_tensors + spec.num_opaques
        y = unflatten_subclass(leaves, spec)
        assert type(y) is type(x) and y.shape == x.shape and y.stride() == x.stride()
        assert_same_leaves(flatten_subclass(y)[0], leaves)

    def test_slots_describe_leaves(self) -> None:
        x = self.make()
        leaves, spec = flatten_subclass(x)
        slots = list(iter_slots(spec, "x"))
        assert [s.unwrapped_idx for _, s in slots] == list(range(len(leaves)))
        for path, slot in slots:
            leaf = leaves[slot.unwrapped_idx]
            if isinstance(slot, OpaqueSlot):
                assert opaque_kind(leaf) == "reference", path
                assert isinstance(leaf, slot.opaque_type), path
            else:
                assert isinstance(leaf, torch.Tensor) and not is_wrapper_subclass(leaf), path

    def test_runtime_wrap_unwrap(self) -> None:
        args = [torch.ones(2), self.make(), self.make()]
        metas = describe_args(args)
        by_spec = unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
        generic = unwrap_args(args, is_joint_structure=False)
        assert_same_leaves(by_spec, generic)
        runtime = [m.runtime_safe() if isinstance(m, SubclassLayout) else m for m in metas]
        for is_runtime, use in ((True, runtime), (False, metas)):
            out = wrap_args(by_spec, subclass_metas=use, is_runtime=is_runtime)
            assert len(out) == len(args)
            for a, o in zip(args, out, strict=True):
                assert type(o) is type(a)
                assert_same_leaves(
                    unwrap_args([o], is_joint_structure=False),
                    unwrap_args([a], is_joint_structure=False),
                )

    def test_joint_structure_with_saved_activations(self) -> None:
        primals, tangents = [self.make()], [self.make()]
        p_metas, t_metas = describe_args(primals), describe_args(tangents)
        flat_p, flat_t = unwrap_args((primals, tangents), is_joint_structure=True, subclass_metas=(p_metas, t_metas))
        saved = [torch.zeros(1), torch.zeros(2)]
        out = wrap_args([*flat_p, *saved], subclass_metas=p_metas, num_fw_outs_saved_for_bw=2, is_runtime=True)
        assert out[1] is saved[0] and out[2] is saved[1]
        assert_same_leaves(unwrap_args([out[0]], is_joint_structure=False), flat_p)
        (t_meta,) = t_metas
        assert isinstance(t_meta, SubclassLayout)
        assert len(flat_t) == t_meta.arg_count

    def test_meta_pickles(self) -> None:
        (meta,) = describe_args([self.make()])
        assert isinstance(meta, SubclassLayout)
        safe = meta.runtime_safe()
        clone = pickle.loads(pickle.dumps(safe))
        assert clone == safe and clone.arg_count == safe.arg_count

    def test_alias_pattern_tracks_identity(self) -> None:
        a, b = self.make(), self.make()
        (meta,) = describe_args([a])
        assert isinstance(meta, SubclassLayout)
        # Two instances: the pattern matches the flat leaves' identity.
        flat = unwrap_args([a, b], is_joint_structure=False)
        pattern = opaque_alias_pattern(flat)
        assert len(pattern.slots) == 2 * meta.num_opaques
        slots = [i for i, v in enumerate(flat) if not isinstance(v, torch.Tensor)]
        owners = [next(j for j in slots if flat[j] is flat[i]) for i in slots]
        expected = OpaqueAliasPattern(tuple(slots), tuple(owners))
        assert pattern == expected, f"alias pattern {pattern}, expected {expected} from the leaves' identity"
        # One instance twice: each opaque slot of the second copy shares the first's.
        twice = opaque_alias_pattern(unwrap_args([a, a], is_joint_structure=False))
        once = opaque_alias_pattern(unwrap_args([a], is_joint_structure=False))
        width = meta.arg_count
        assert twice == OpaqueAliasPattern(
            (*once.slots, *(s + width for s in once.slots)), (*once.owners, *once.owners)
        ), f"alias pattern of the same instance twice is {twice}; its second copy does not share the first's opaques"

    def test_tangent_keeps_opaque_slots(self) -> None:
        x = self.make()
        (meta,) = describe_args([x], with_memory_format=True)
        assert isinstance(meta, SubclassLayout)
        _, leaves = unwrap_tangent(self.make(), meta)
        assert len(leaves) == meta.arg_count
        for _, slot in iter_slots(meta):
            if isinstance(slot, OpaqueSlot):
                assert opaque_kind(leaves[slot.unwrapped_idx]) == "reference"
