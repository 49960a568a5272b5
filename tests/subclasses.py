"""Subclasses and opaque classes shared by the tests.

Every subclass has a data-free ``__repr__`` (see DESIGN.md: printing fake
tensor data can crash tracing with log capture on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

import opaque_subclass
from opaque_subclass import OpaqueBase
from opaque_subclass.core.registry import opaque_type_of


class Mesh(OpaqueBase):
    """A reference opaque: identity matters, equality is never used."""

    def __init__(self, name: str = "m") -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Mesh({self.name!r})"


class Stream(OpaqueBase):
    """A second reference opaque type."""

    def __init__(self, idx: int = 0) -> None:
        self.idx = idx

    def __repr__(self) -> str:
        return f"Stream({self.idx})"


class ForeignHandle:
    """A reference opaque that does not inherit OpaqueBase (like DeviceMesh on 2.11)."""

    def __init__(self, name: str = "h") -> None:
        self.name = name


class Config(OpaqueBase):
    """A value opaque: a constant compared by equality."""

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and other.bits == self.bits

    def __hash__(self) -> int:
        return hash(self.bits)

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        return f"Config({self.bits})", {"Config": Config}


class NotRegistered:
    """Never registered: must be rejected in an attribute list."""


opaque_subclass.register_opaque(Mesh)
opaque_subclass.register_opaque(Stream)
opaque_subclass.register_opaque(ForeignHandle)
opaque_subclass.register_opaque(Config, kind="value")


class _Wrapper(torch.Tensor):
    """Common machinery: inner tensors named by INNER, opaques named by OPAQUES."""

    INNER: tuple[str, ...] = ()
    OPAQUES: tuple[str, ...] = ()

    @staticmethod
    def __new__(cls, *values: Any, ctx: Any = None, outer: torch.Tensor | None = None) -> Any:
        first = values[0]
        like = outer if outer is not None else first
        r = torch.Tensor._make_wrapper_subclass(
            cls, like.shape, strides=like.stride(), dtype=like.dtype, device=like.device
        )
        for name, v in zip(cls.INNER + cls.OPAQUES, values, strict=True):
            setattr(r, name, v)
        r._ctx = ctx
        return r

    def __init__(self, *values: Any, ctx: Any = None, outer: Any = None) -> None:
        pass

    @classmethod
    def _first_instance(cls, args: Any, kwargs: Any) -> Any:
        """The first instance among all arguments, also inside lists (aten.cat)."""
        return next(a for a in tree_leaves((args, kwargs)) if isinstance(a, cls))

    @classmethod
    def _run_unwrapped(cls, func: Any, args: Any, kwargs: Any, unwrap: Callable[[Any], Any]) -> Any:
        """``func`` on the arguments with each instance replaced by ``unwrap(instance)``."""
        return func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs or {}))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self.shape)})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return [*self.INNER, *self.OPAQUES], self._ctx

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        values = [inner[n] for n in cls.INNER + cls.OPAQUES]
        return cls(*values, ctx=ctx)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        proto = cls._first_instance(args, kwargs)
        opaques = [getattr(proto, n) for n in cls.OPAQUES]
        n_inner = len(cls.INNER)

        def unwrap(t: Any) -> Any:
            return getattr(t, cls.INNER[0])

        out = cls._run_unwrapped(func, args, kwargs, unwrap)
        return tree_map_only(
            torch.Tensor,
            lambda t: cls(*([t] * n_inner), *opaques, ctx=proto._ctx),
            out,
        )


class PlainPair(_Wrapper):
    """Two tensors, no opaque (like torch's TwoTensor)."""

    INNER = ("a", "b")


class MeshTensor(_Wrapper):
    """One tensor and one opaque: the sharded-tensor shape."""

    INNER = ("_data",)
    OPAQUES = ("_mesh",)


class ConstantMeshTensor(MeshTensor):
    """``MeshTensor`` whose ``__tensor_flatten__`` returns constants only (no context): every
    instance flattens alike, so Dynamo's two Python guards per input give way to one check
    of the class (``opaque_subclass.fixes.subclass_guards``)."""

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", "_mesh"], None


class BareMeshTensor(MeshTensor):
    """``MeshTensor`` with torch's default ``Tensor.__repr__`` (it reads the values), as many
    hand-written subclasses have."""

    __repr__ = torch.Tensor.__repr__


class MultiOpaque(_Wrapper):
    """Two tensors and two opaques of different types."""

    INNER = ("_a", "_b")
    OPAQUES = ("_mesh", "_stream")


class ReturnsPlain(MeshTensor):
    """Broken on purpose: ``__tensor_unflatten__`` returns the inner tensor
    instead of the subclass (what the library's errors must name)."""

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return inner["_data"]


class SetNames(MeshTensor):
    """Broken on purpose: ``__tensor_flatten__`` returns its names as a set
    (no order, so no flat-slot order either)."""

    def __tensor_flatten__(self) -> tuple[Any, Any]:
        return {"_data", "_mesh"}, self._ctx


class ForeignTensor(_Wrapper):
    """Holds an opaque whose class does not inherit OpaqueBase."""

    INNER = ("_data",)
    OPAQUES = ("_handle",)


class Interleaved(_Wrapper):
    """Opaque listed between tensors, to pin down slot order."""

    INNER = ("_a", "_b")
    OPAQUES = ("_mesh",)

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_a", "_mesh", "_b"], self._ctx


def nested(depth: int, mesh_names: str = "abc", data: torch.Tensor | None = None) -> torch.Tensor:
    """MeshTensor nested ``depth`` levels, a distinct Mesh at each level."""
    t: torch.Tensor = data if data is not None else torch.arange(6.0).reshape(2, 3)
    for level in range(depth):
        t = MeshTensor(t, Mesh(mesh_names[level % len(mesh_names)] + str(level)), ctx=("lvl", level))
    return t


@torch.library.custom_op("opaque_subclass_tests::add_name_length", mutates_args=())
def add_name_length(t: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    """A custom op taking a reference opaque: ``t + len(mesh.name)``."""
    return t + len(mesh.name)


@add_name_length.register_fake
def _(t: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    return torch.empty_like(t)


class HoldsMesh(torch.nn.Module):
    """A module keeping a mesh as a plain attribute, read by a custom op (export
    lifts it as a custom-object constant)."""

    def __init__(self, mesh: Mesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return add_name_length(x, self.mesh)


class ValueMesh(OpaqueBase):
    """A reference opaque whose == compares its layout only, as DeviceMesh's does:
    two meshes over different process groups (``group``) compare equal."""

    def __init__(self, size: int, group: str) -> None:
        self.size, self.group = size, group

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueMesh) and other.size == self.size

    def __hash__(self) -> int:
        return hash(self.size)

    def __repr__(self) -> str:
        return f"ValueMesh({self.size}, {self.group!r})"


opaque_subclass.register_opaque(ValueMesh)


class Gauge(OpaqueBase):
    """A reference opaque whose members compiled code uses: ``factor()`` and
    ``offset`` are evaluated on the real object (and guarded), ``doubled()`` is
    traced; ``other()`` is not declared."""

    def __init__(self, factor: int, offset: int = 0) -> None:
        self._factor = factor
        self.offset = offset

    def factor(self) -> int:
        return self._factor

    def doubled(self) -> int:
        return 2 * self.offset

    def other(self) -> int:
        return 1

    def __repr__(self) -> str:
        return f"Gauge({self._factor}, {self.offset})"


opaque_subclass.register_opaque(
    Gauge,
    members={
        "factor": opaque_subclass.Member.USE_REAL,
        "offset": opaque_subclass.Member.USE_REAL,
        "doubled": opaque_subclass.Member.INLINED,
    },
)


class GaugeTensor(_Wrapper):
    """One tensor and a ``Gauge`` whose members compiled code reads."""

    INNER = ("_data",)
    OPAQUES = ("_gauge",)


class GroupTensor(_Wrapper):
    """A Float8-like tensor holding its amax-reduction ``ProcessGroup`` as an
    opaque attribute (``ProcessGroup`` must be registered: :func:`fake_world`)."""

    INNER = ("_data",)
    OPAQUES = ("_group",)


class GroupScaled(_Wrapper):
    """A Float8-like tensor whose ``__torch_dispatch__`` scales every result by
    the size of its amax-reduction group, read on the real group while
    AOTAutograd traces: the unguarded baked ``size()`` of issue #26 (on torch
    2.12 - 2.15, compiled for a group of 2, a call with a group of 4 still
    divides by 2; torch 2.11 fails to compile it). ``ProcessGroup`` must be
    registered (:func:`fake_world`)."""

    INNER = ("_data",)
    OPAQUES = ("_group",)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        proto = cls._first_instance(args, kwargs)
        g = proto._group
        n = g.size()
        out = cls._run_unwrapped(func, args, kwargs, lambda t: t._data)
        return tree_map_only(torch.Tensor, lambda t: cls(t / n, g), out)


class SummedOverGroup(_Wrapper):
    """Sums every result over its group in ``__torch_dispatch__``: a collective
    the program issues below Dynamo, on the group of the input it traces."""

    INNER = ("_data",)
    OPAQUES = ("_group",)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        import torch.distributed._functional_collectives as funcol
        from torch.utils._pytree import tree_map_only

        g = cls._first_instance(args, kwargs)._group
        out = cls._run_unwrapped(func, args, kwargs, lambda t: t._data)
        out = tree_map_only(torch.Tensor, lambda r: funcol.all_reduce(r, "sum", g), out)
        return tree_map_only(torch.Tensor, lambda r: cls(r, g), out)


class CoordinateShifted(_Wrapper):
    """A tensor and its ``DeviceMesh`` whose ``__torch_dispatch__`` adds the
    mesh's coordinate (of this rank, on dim 0) to every result, read on the
    mesh while AOTAutograd traces: a rank-dependent value read below Dynamo
    (issue #25; torch 2.11 fails to compile it, its fake mesh answers no member)."""

    INNER = ("_data",)
    OPAQUES = ("_mesh",)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        proto = cls._first_instance(args, kwargs)
        mesh = proto._mesh
        shift = mesh.get_coordinate()[0]
        out = cls._run_unwrapped(func, args, kwargs, lambda t: t._data)
        return tree_map_only(torch.Tensor, lambda t: cls(t + shift, mesh), out)


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[Any]:
    """torch's fake process group (``torch.testing._internal.distributed.fake_pg``:
    no communication, any world size, one process) as the default group, with
    ``ProcessGroup`` registered as a reference opaque; destroyed on exit."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import ProcessGroup
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        opaque_subclass.register_opaque(ProcessGroup)
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """A sharding spec holding its mesh, as DTensor 2.11's DTensorSpec and
    PhysicsNeMo's ShardTensor spec do."""

    mesh: Any
    dim: int


class ShardLike(_Wrapper):
    """A sharded tensor that keeps its mesh inside the flatten context (a
    ShardSpec), not among its attributes: what lint OSC001 reports."""

    INNER = ("_local",)

    @property
    def spec(self) -> ShardSpec:
        return self._ctx  # type: ignore[no-any-return]  # set by _Wrapper


@contextlib.contextmanager
def registered_mesh_world_of_one(timeout_s: float = 60) -> Iterator[Any]:
    """A gloo process group of one rank on 127.0.0.1 (a free port) and its 1-D
    ``DeviceMesh``, with ``DeviceMesh`` registered as a reference opaque; the
    group is destroyed on exit."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=timeout_s))
    try:
        opaque_subclass.register_opaque(DeviceMesh)
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


class Listing(torch.Tensor):
    """``_data`` plus the attributes ``names`` lists (opaques or tensors): every
    attribute it was given is kept, listed or not, and the flatten context is
    one constant, so only the attribute list tells two instances apart."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, names: list[str], **attrs: Any) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data: torch.Tensor, names: list[str], **attrs: Any) -> None:
        self._data = data
        self._names = names
        for k, v in attrs.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"Listing({self._names})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return list(self._names), "ctx"

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return Listing(inner["_data"], list(inner), **{k: v for k, v in inner.items() if k != "_data"})

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        ref = next(a for a in args if isinstance(a, Listing))
        out = func(*tree_map_only(Listing, lambda t: t._data, args), **(kwargs or {}))
        listed = {k: getattr(ref, k) for k in ref._names if k != "_data"}
        return tree_map_only(torch.Tensor, lambda t: Listing(t, list(ref._names), **listed), out)


class Anything(OpaqueBase):
    """A proxy-like reference opaque: every attribute it lacks is a function
    returning the object (``hasattr(obj, name)`` is true for any name)."""

    def __init__(self, name: str = "a") -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Anything({self.name!r})"

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


opaque_subclass.register_opaque(Anything)


class Float8Like(_Wrapper):
    """A Float8-like training tensor (issue #26 item 7): quantized data, its
    scale (a 0-d tensor) and its amax-reduction ``ProcessGroup``, kept as an
    opaque attribute. Its op rule computes on the dequantized value
    (``_data * _scale``) and averages the result over the group, dividing it by
    the group's size, read on the real group while AOTAutograd traces: a value
    compiled in with no guard (OSC004). ``ProcessGroup`` must be registered."""

    INNER = ("_data", "_scale")
    OPAQUES = ("_group",)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        proto = cls._first_instance(args, kwargs)
        group, scale = proto._group, proto._scale
        n = group.size()

        def dequantized(t: Float8Like) -> torch.Tensor:
            return t._data * t._scale

        out = cls._run_unwrapped(func, args, kwargs, dequantized)
        return tree_map_only(torch.Tensor, lambda t: cls(t / n / scale, scale, group), out)


@dataclasses.dataclass(frozen=True)
class ShardTensorSpec:
    """A PhysicsNeMo-like sharding spec: the mesh, the placements (a shard dim
    per mesh dim) and the local shape of each rank's shard (uneven sharding).
    Compared by value, the mesh by ``DeviceMesh.__eq__`` (its ranks and
    layout, not its process groups)."""

    mesh: Any
    placements: tuple[int, ...]
    sharding_shapes: tuple[tuple[int, ...], ...]


class PhysicsNeMoLikeShardTensor(torch.Tensor):
    """A PhysicsNeMo-like ``ShardTensor`` (nvidia-physicsnemo 2.2): a local shard
    and a :class:`ShardTensorSpec` (holding a ``DeviceMesh``) in the flatten
    context ``(spec, requires_grad)``, with a ``__metadata_guard__`` that
    compares specs by ``==``, as DTensor's subclasses have (so torch compiles
    it): OSC001, the stale mesh. As PhysicsNeMo's does, it builds every op
    output (so every gradient) as ``PhysicsNeMoLikeShardTensor`` itself, not
    as the class of its arguments, and its tangent hook
    (``__coerce_same_metadata_as_tangent__``) rebuilds a tangent through
    ``__tensor_unflatten__`` with ``_local_tensor`` alone and the recorded
    context."""

    @staticmethod
    def __new__(cls, local_tensor: torch.Tensor, spec: ShardTensorSpec, *, requires_grad: bool = False) -> Any:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            local_tensor.shape,
            strides=local_tensor.stride(),
            dtype=local_tensor.dtype,
            device=local_tensor.device,
            requires_grad=requires_grad,
        )
        r._local_tensor, r._spec = local_tensor, spec
        return r

    def __init__(self, local_tensor: torch.Tensor, spec: ShardTensorSpec, *, requires_grad: bool = False) -> None:
        pass

    def __repr__(self) -> str:
        return f"PhysicsNeMoLikeShardTensor(shape={tuple(self.shape)}, placements={self._spec.placements})"

    @property
    def spec(self) -> ShardTensorSpec:
        return self._spec  # type: ignore[no-any-return]  # set by __new__

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_local_tensor"], (self._spec, self.requires_grad)

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        spec, requires_grad = ctx
        return cls(inner["_local_tensor"], spec, requires_grad=requires_grad)

    @classmethod
    def __metadata_guard__(cls, orig: Any, other: Any) -> bool:
        return bool(orig == other)

    def _stable_hash_for_caching(self) -> str:
        # As PhysicsNeMo's: the instance's spec by value (the mesh by its class), never an id().
        spec = self._spec
        key = (opaque_type_of(spec.mesh).__qualname__, spec.placements,
               spec.sharding_shapes, tuple(self.shape), str(self.dtype), self.requires_grad)  # fmt: skip
        return hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        proto = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, PhysicsNeMoLikeShardTensor))
        unwrap = lambda t: t._local_tensor  # noqa: E731
        kw = tree_map_only(PhysicsNeMoLikeShardTensor, unwrap, kwargs or {})
        out = func(*tree_map_only(PhysicsNeMoLikeShardTensor, unwrap, args), **kw)
        # PhysicsNeMo builds results as ShardTensor itself, whatever the arguments' class
        return tree_map_only(torch.Tensor, lambda t: PhysicsNeMoLikeShardTensor(t, proto._spec), out)

    def __coerce_same_metadata_as_tangent__(self, expected: Any, expected_type: Any = None) -> Any:
        spec, _ = expected
        if spec.placements == self._spec.placements:
            return self
        # As PhysicsNeMo rebuilds a tangent: _local_tensor alone, and the recorded context.
        return type(self).__tensor_unflatten__(
            {"_local_tensor": self._local_tensor}, expected, self.shape, self.stride()
        )
