"""``ShardedTensor``: a reference sharded tensor built on :class:`OpaqueSubclass`,
with the ``DeviceMesh`` as an opaque attribute.

Note [Sharding semantics]
-------------------------
A ``ShardedTensor`` holds this rank's shard ``_local`` of one *global* tensor,
the 1-D ``DeviceMesh`` ``_mesh`` (``n`` ranks) and ``_shard_dim``:

* ``_shard_dim = d``: the global tensor is the concatenation of the ranks'
  equal-size shards along ``d`` (no uneven shards).
* ``_shard_dim = None``: *replicated*, every rank holds the whole tensor.
  Results equal on every rank (a full reduction, a matmul contracting over the
  shard dim) are replicated ``ShardedTensor`` objects, not plain tensors, so the
  mesh keeps flowing and gradients of sharded parameters stay ``ShardedTensor``.

A plain tensor meeting a ``ShardedTensor`` counts as replicated: the caller
keeps it equal on every rank (as in Megatron-style tensor parallelism).
Gradients follow one global loss computed identically on every rank and take
the placement the ops give them; a replicated gradient (``(w * 2).sum()``)
still updates the right slice in ``w -= lr * w.grad``. Random ops on
replicated tensors break replication unless every rank seeds alike.

Note [Process groups resolved at run time]
------------------------------------------
The mesh is a reference opaque (torch 2.12+ registers ``DeviceMesh`` itself; on
torch 2.11 the first ``ShardedTensor`` or collective does, not the import), so
torch.compile makes it a graph input instead of baking in the traced mesh. The
collectives (:func:`all_reduce_sum`, :func:`all_gather`, :func:`local_chunk`)
are custom ops taking the mesh and calling ``mesh.get_group()`` /
``mesh.get_local_rank()`` when they *run*: a graph compiled on mesh A and called
on mesh B talks to B's process group without recompiling. Tracing never reads
the mesh (it is torch's fake wrapper there); the shard count comes from shapes,
``global size // local size`` along the shard dim.

A ``DeviceMesh`` annotation gives schema type ``PyObject`` on torch 2.11 and
2.13 alike (``infer_schema`` accepts registered opaque types). The ops work
eagerly on plain tensors, and under torch.compile with the mesh from a
``ShardedTensor`` or a direct argument (on torch 2.11 the backport makes a
registered ``DeviceMesh`` a graph input instead of a ``DeviceMeshVariable``).

Ops (see :func:`ShardedTensor.__torch_dispatch__`)
--------------------------------------------------
* only replicated arguments: any op, on the local tensors;
* pointwise (``torch.Tag.pointwise``) and shape-keeping ops (clone, detach,
  ``*_like``, copies): on the shards, replicated operands spanning the shard
  dim cut to this rank's slice with :func:`local_chunk`;
* ``t``, ``transpose``, ``permute``, ``view``, ``_unsafe_view``, ``unsqueeze``,
  ``squeeze``, ``expand``: the shard dim moves (never split, merged, squeezed
  or expanded);
* ``mm`` and ``addmm`` (hence ``F.linear`` and 2-D ``@``): replicated @
  column-sharded is column-sharded; row-sharded @ replicated is row-sharded; a
  contraction over the shard dim is a local product plus
  :func:`all_reduce_sum` (replicated); otherwise one operand is all-gathered;
* ``sum`` and ``mean`` over all dims or a dim list: over the shard dim via
  :func:`all_reduce_sum` (replicated), else on the shards.

Any other op on a sharded argument raises :class:`OpaqueSubclassError` naming the
op and the fix: ``x.redistribute(None)``, or ``@ShardedTensor.implements(op)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional, cast

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

from opaque_subclass.authoring.base import OpaqueSubclass
from opaque_subclass.authoring.dispatch import lookup
from opaque_subclass.core.registry import real_object
from opaque_subclass.sharded import messages
from opaque_subclass.sharded.collectives import CollectiveRecord, _ops, _resized, record_collectives

from . import collectives as _collectives

__all__ = [  # noqa: F822 - the collective ops come from __getattr__
    "CollectiveRecord",
    "ShardedTensor",
    "all_gather",
    "all_reduce_sum",
    "local_chunk",
    "record_collectives",
]

# The collective ops, re-exported: defined on first access (importing this module defines none).
__getattr__ = _collectives.reexporting(__name__)


aten = torch.ops.aten


@torch.library.custom_op("opaque_subclass::redistribute", mutates_args=())
def _redistribute_op(x: torch.Tensor, shard_dim: Optional[int], num_shards: int) -> torch.Tensor:  # noqa: UP045 - custom_op schema inference wants Optional
    # Only reached for plain tensors; ShardedTensor handles it in its op table.
    if shard_dim is not None:
        raise messages.redistribute_plain(shard_dim)
    return x.clone()


@_redistribute_op.register_fake
def _(x: torch.Tensor, shard_dim: Optional[int], num_shards: int) -> torch.Tensor:  # noqa: UP045
    return x.new_empty(x.shape)


def _save_placement(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x = inputs[0]
    ctx.src = x._shard_dim if isinstance(x, ShardedTensor) else None
    ctx.num_shards = inputs[2]


_redistribute_op.register_autograd(
    lambda ctx, grad: (_redistribute_op(grad, ctx.src, ctx.num_shards), None, None), setup_context=_save_placement
)

# ---------------------------------------------------------------- the tensor


def _is_fake(obj: object) -> bool:
    return real_object(obj) is not obj


def _same_object(a: object, b: object) -> bool:
    return real_object(a) is real_object(b)


def _dense_strides_like(size: Sequence[Any], like: Sequence[int]) -> tuple[Any, ...]:
    """Dense strides for ``size`` with the dimension order of strides ``like``."""
    order = sorted(range(len(size)), key=lambda i: like[i], reverse=True)
    strides: list[Any] = [0] * len(size)
    running: Any = 1
    for i in reversed(order):
        strides[i] = running
        running = running * max(size[i], 1)
    return tuple(strides)


class _FromLocal(torch.autograd.Function):
    """ShardedTensor's construction from a shard that requires grad (applied as
    :class:`OpaqueSubclass` applies its ``_from_inner_function``)."""

    @staticmethod
    def forward(
        ctx: Any, cls: Any, others: dict[str, Any], outer_size: Any, outer_stride: Any, local: torch.Tensor
    ) -> ShardedTensor:
        mesh, dim = others["_mesh"], others["_shard_dim"]
        out = ShardedTensor(local.detach(), mesh, dim, outer_size=outer_size, outer_stride=outer_stride)
        ctx.mesh, ctx.dim, ctx.n = mesh, dim, _num_shards(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        if isinstance(grad, ShardedTensor):
            if grad._shard_dim != ctx.dim:
                grad = cast(ShardedTensor, _redistribute_op(grad, ctx.dim, ctx.n))
            grad = grad._local
        elif ctx.dim is not None:
            grad = _ops().local_chunk(grad, ctx.mesh, ctx.dim, ctx.n)
        return None, None, None, None, grad


class ShardedTensor(OpaqueSubclass, register_opaques=True):
    """A shard of a global tensor on a 1-D ``DeviceMesh``; see Note [Sharding semantics].

    Parameters
    ----------
    _local
        This rank's shard (or, replicated, the whole tensor). If it requires
        grad, the construction is differentiable with respect to it: the
        gradient, brought to this placement, flows back as its shard. For a
        leaf, pass a tensor that does not require grad and ``requires_grad=True``.
    _mesh
        A 1-D :class:`~torch.distributed.device_mesh.DeviceMesh`.
    _shard_dim
        The dim the global tensor is split along, ``0 <= _shard_dim <
        _local.dim()``, or ``None`` for replicated.

    Examples
    --------
    >>> w = ShardedTensor.from_full(torch.randn(32, 16), mesh, 0, requires_grad=True)
    >>> y = torch.nn.functional.linear(x, w)  # sharded on dim 1: each rank has 32 / n features
    """

    tensor_attrs = ("_local",)
    opaque_attrs = {"_mesh": DeviceMesh}
    meta_attrs = ("_shard_dim",)

    _local: torch.Tensor
    _mesh: DeviceMesh
    _shard_dim: int | None

    # Construction is OpaqueSubclass's, with the checks of a shard and its mesh, the
    # global shape as the default outer shape, and a differentiable construction whose
    # gradient is brought to this placement before its shard flows back to ``_local``.
    _from_inner_function = _FromLocal

    @classmethod
    def _bind(cls, values: tuple[Any, ...], named: dict[str, Any]) -> dict[str, Any]:
        bound = super()._bind(values, named)
        mesh = bound["_mesh"]
        _check_shard_dim(cls, bound["_local"], bound["_shard_dim"])
        if not _is_fake(mesh) and mesh.ndim != 1:
            raise messages.mesh_not_1d(cls, mesh.ndim)
        return bound

    @classmethod
    def _default_outer_shape(  # type: ignore[override]  # OpaqueSubclass declares the hook, None there
        cls, bound: dict[str, Any], outer_stride: Sequence[int] | None
    ) -> tuple[Any, Any]:
        local, mesh, dim = bound["_local"], bound["_mesh"], bound["_shard_dim"]
        if dim is None:
            return None, outer_stride  # replicated: the shard's shape
        if _is_fake(mesh):
            raise messages.global_size_while_tracing(cls)
        size = _resized(local, dim, local.shape[dim] * mesh.size())
        return size, _dense_strides_like(size, local.stride())

    @classmethod
    def from_inner(cls, *values: Any, **options: Any) -> Any:
        """The constructor, differentiable with respect to ``_local`` (as the constructor is)."""
        return cls(*values, **options)

    # ------------------------------------------------------------ public helpers

    @classmethod
    def from_full(
        cls, full: torch.Tensor, mesh: DeviceMesh, shard_dim: int | None, *, requires_grad: bool = False
    ) -> ShardedTensor:
        """This rank's shard of ``full`` (the same tensor on every rank), eagerly.

        ``shard_dim=None`` gives a replicated tensor holding a copy of ``full``.
        """
        full = full.detach()
        if shard_dim is None:
            return cls(full.clone(), mesh, None, requires_grad=requires_grad)
        _check_shard_dim(cls, full, shard_dim)
        n = mesh.size()
        if full.shape[shard_dim] % n != 0:
            raise messages.from_full_not_divisible(cls, full.shape[shard_dim], shard_dim, n)
        return cls(_ops().local_chunk(full, mesh, shard_dim, n), mesh, shard_dim, requires_grad=requires_grad)

    @property
    def mesh(self) -> DeviceMesh:
        """The ``DeviceMesh`` (the object itself)."""
        return self._mesh

    @property
    def shard_dim(self) -> int | None:
        """The dim the global tensor is split along; ``None`` when replicated."""
        return self._shard_dim

    def num_shards(self) -> int:
        """Number of shards (the mesh size), from the shapes; 1 when replicated."""
        return _num_shards(self)

    def local_tensor(self) -> torch.Tensor:
        """This rank's shard, detached from autograd."""
        return self._local.detach()

    def redistribute(self, shard_dim: int | None) -> ShardedTensor:
        """The same global tensor sharded along ``shard_dim`` (``None``: replicated).

        Differentiable and traceable by torch.compile. Replicated to sharded needs
        the mesh size and so runs eagerly only; sharded to anything else works
        everywhere.
        """
        if self._shard_dim is not None:
            n = _num_shards(self)
        else:
            n = 1 if shard_dim is None else self._mesh.size()
        return cast(ShardedTensor, _redistribute_op(self, shard_dim, n))  # the op table returns a ShardedTensor

    def full_tensor(self) -> torch.Tensor:
        """The global tensor as a plain tensor on every rank (detached from autograd)."""
        with torch.no_grad():
            return self.redistribute(None)._local.detach()

    def wrap_like(self, **tensors: torch.Tensor) -> ShardedTensor:
        """A tensor with these shards, this mesh and shard dim; the global size
        follows from the shard sizes and the number of shards."""
        return _wrap(tensors["_local"], self._mesh, self._shard_dim, _num_shards(self))

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # Tensor declares its disabled default as a plain function
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        """The op table first (``t``, ``view``, ``mm``, ``sum``, ...); then, when no
        argument is sharded, the op on the local tensors; then pointwise and
        shape-keeping ops on the shards; anything else is an error."""
        kwargs = kwargs or {}
        impl = lookup(cls, func)
        if impl is not None:
            return impl(func, args, kwargs)
        mesh, dim, n = _common_placement(func, tree_flatten((args, kwargs))[0])
        if dim is None or torch.Tag.pointwise in func.tags or func.overloadpacket in _SHAPE_KEEPING:
            return _on_locals(func, args, kwargs, mesh, dim, n)
        raise messages.no_rule(cls, func, dim)


_SHAPE_KEEPING = frozenset(
    getattr(aten, name)
    for name in (
        "clone",
        "detach",
        "alias",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "_to_copy",
        "copy_",
        "fill_",
        "zero_",
        "lift_fresh",
    )
)


def _check_shard_dim(cls: type, local: torch.Tensor, dim: object) -> None:
    if dim is None:
        return
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise messages.shard_dim_not_int(cls, dim)
    if not 0 <= dim < local.dim():
        raise messages.shard_dim_out_of_range(cls, dim, local.dim())
    if local.shape[dim] == 0:
        raise messages.empty_shard(cls, dim)


def _num_shards(x: ShardedTensor) -> int:  # a SymInt while tracing, typed int as torch.Size's sizes are
    d = x._shard_dim
    return 1 if d is None else x.shape[d] // x._local.shape[d]


def _wrap(local: torch.Tensor, mesh: DeviceMesh, dim: int | None, n: Any) -> ShardedTensor:
    if dim is None:
        size, stride = list(local.shape), local.stride()
    else:
        size = _resized(local, dim, local.shape[dim] * n)
        stride = _dense_strides_like(size, local.stride())
    return cast(
        ShardedTensor, ShardedTensor.__tensor_unflatten__({"_local": local, "_mesh": mesh}, (dim,), size, stride)
    )


def _placement(t: object) -> int | None:
    return t._shard_dim if isinstance(t, ShardedTensor) else None


def _common_mesh(func: Any, flat: Sequence[Any]) -> DeviceMesh:
    """The one DeviceMesh of the ShardedTensor arguments (compared by identity)."""
    mesh: Any = None
    for t in flat:
        if not isinstance(t, ShardedTensor):
            continue
        if mesh is None:
            mesh = t._mesh
        elif not _same_object(mesh, t._mesh):
            raise messages.different_meshes(func)
    return cast(DeviceMesh, mesh)  # or torch's fake wrapper of one, while tracing


def _common_placement(func: Any, flat: list[Any]) -> tuple[DeviceMesh, int | None, Any]:
    """Mesh shared by the ShardedTensor arguments, the aligned shard dim of the
    sharded ones (counted from the right, as broadcasting does; as an index into
    the widest argument), and the number of shards."""
    mesh = _common_mesh(func, flat)
    tensors = [a for a in flat if isinstance(a, torch.Tensor)]
    ndim = max(t.dim() for t in tensors)
    dim: int | None = None
    n: Any = 1
    for t in tensors:
        if not isinstance(t, ShardedTensor) or t._shard_dim is None:
            continue
        aligned = t._shard_dim + ndim - t.dim()
        if dim is not None and dim != aligned:
            raise messages.different_shard_dims(func, dim, aligned, dim - (ndim - t.dim()))
        dim, n = aligned, _num_shards(t)
    return mesh, dim, n


def _on_locals(func: Any, args: Any, kwargs: Any, mesh: DeviceMesh, dim: int | None, n: Any) -> Any:
    """Run ``func`` on the local tensors; cut replicated operands that span the
    shard dim ``dim`` to this rank's slice; wrap tensor results with ``dim``."""
    flat, spec = tree_flatten((args, kwargs))
    ndim = max(t.dim() for t in flat if isinstance(t, torch.Tensor))
    local_flat: list[Any] = []
    for a in flat:
        if isinstance(a, ShardedTensor):
            a_local = a._local
            if dim is not None and a._shard_dim is None:
                a_local = _cut(a_local, mesh, dim - (ndim - a.dim()), n)
            local_flat.append(a_local)
        elif isinstance(a, torch.Tensor) and dim is not None:
            local_flat.append(_cut(a, mesh, dim - (ndim - a.dim()), n))
        else:
            local_flat.append(a)
    _check_writes(func, args, dim, ndim)
    local_args, local_kwargs = tree_unflatten(local_flat, spec)
    out = func(*local_args, **local_kwargs)
    out = tree_map_only(torch.Tensor, lambda t: _wrap(t, mesh, None if dim is None else dim - (ndim - t.dim()), n), out)
    return return_and_correct_aliasing(func, args, kwargs, out)


def _cut(t: torch.Tensor, mesh: DeviceMesh, dim: int, n: Any) -> torch.Tensor:
    if dim < 0 or t.shape[dim] == 1:
        return t  # broadcast along the shard dim: every rank uses all of it
    return cast(torch.Tensor, _ops().local_chunk(t, mesh, dim, n))


def _check_writes(func: Any, args: Sequence[Any], dim: int | None, ndim: int) -> None:
    for arg, schema_arg in zip(args, func._schema.arguments, strict=False):
        info = schema_arg.alias_info
        if info is None or not info.is_write:
            continue
        own = _placement(arg)
        sharded = isinstance(arg, ShardedTensor)
        if not sharded or (None if own is None else own + ndim - arg.dim()) != dim:
            raise messages.in_place_write(func, dim, schema_arg.name, arg, sharded)


# ---------------------------------------------------------------- op table

Rule = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]


def _rule(*ops: Any) -> Callable[[Rule], Rule]:
    """Register a rule that sees only calls with at least one sharded argument;
    all-replicated calls run on the local tensors."""

    def register(fn: Rule) -> Rule:
        def rule(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            flat = tree_flatten((args, kwargs))[0]
            if all(_placement(a) is None for a in flat):
                return _on_locals(func, args, kwargs, _common_mesh(func, flat), None, 1)
            return fn(func, args, kwargs)

        ShardedTensor.implements(*ops)(rule)
        return fn

    return register


def _moved(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    x: ShardedTensor,
    dim: int | None,
    local_args: tuple[Any, ...],
) -> Any:
    out = _wrap(func(x._local, *local_args), x._mesh, dim, _num_shards(x))
    return return_and_correct_aliasing(func, args, kwargs, out)


@_rule(aten.t.default, aten.transpose.int)
def _transpose(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    d0, d1 = (0, 1) if func is aten.t.default else args[1:3]
    nd = max(x.dim(), 1)
    d0, d1 = d0 % nd, d1 % nd
    swap = {d0: d1, d1: d0}
    return _moved(func, args, kwargs, x, swap.get(x._shard_dim, x._shard_dim), tuple(args[1:]))


@_rule(aten.permute.default)
def _permute(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    dims = [d % x.dim() for d in args[1]]
    return _moved(func, args, kwargs, x, dims.index(x._shard_dim), (args[1],))


@_rule(aten.unsqueeze.default)
def _unsqueeze(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, dim = args[0], args[1] % (args[0].dim() + 1)
    d = x._shard_dim
    return _moved(func, args, kwargs, x, d + 1 if dim <= d else d, (dim,))


@_rule(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, d = args[0], args[0]._shard_dim
    asked: Sequence[int]
    if func is aten.squeeze.default:
        asked = range(x.dim())
    else:
        asked = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
    dims = sorted({i % max(x.dim(), 1) for i in asked if x.shape[i % max(x.dim(), 1)] == 1} - {d})
    out = _wrap(aten.squeeze.dims(x._local, dims), x._mesh, d - sum(1 for i in dims if i < d), _num_shards(x))
    return return_and_correct_aliasing(func, args, kwargs, out)


@_rule(aten.expand.default)
def _expand(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, size = args[0], list(args[1])
    d = x._shard_dim + len(size) - x.dim()
    if size[d] not in (-1, x.shape[x._shard_dim]):
        raise messages.expand_shard_dim(func, size, x._shard_dim, list(x.shape))
    size[d] = -1
    return _moved(func, args, kwargs, x, d, (size, *args[2:]))


@_rule(aten.view.default, aten._unsafe_view.default)
def _view(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, size = args[0], list(args[1])
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = x.numel() // known
    d, n = x._shard_dim, _num_shards(x)
    before = math.prod(x.shape[:d])
    for j, s in enumerate(size):
        if s == x.shape[d] and math.prod(size[:j]) == before:
            local_size = list(size)
            local_size[j] = s // n
            return _moved(func, args, kwargs, x, j, (local_size,))
    raise messages.view_splits_shard_dim(func, list(x.shape), size, d)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mesh = _common_mesh(aten.mm.default, [a, b])
    da, db = _placement(a), _placement(b)
    n = _num_shards(a) if da is not None else _num_shards(b)  # type: ignore[arg-type]  # a placement means a ShardedTensor; else b is the sharded one
    la = a._local if isinstance(a, ShardedTensor) else a
    lb = b._local if isinstance(b, ShardedTensor) else b
    if (da, db) == (None, 1):
        return _wrap(aten.mm(la, lb), mesh, 1, n)
    if (da, db) == (0, None):
        return _wrap(aten.mm(la, lb), mesh, 0, n)
    if (da, db) == (1, 0):
        return _wrap(_ops().all_reduce_sum(aten.mm(la, lb), mesh), mesh, None, 1)
    if (da, db) == (None, 0):
        return _wrap(_ops().all_reduce_sum(aten.mm(_ops().local_chunk(la, mesh, 1, n), lb), mesh), mesh, None, 1)
    if (da, db) == (1, None):
        return _wrap(_ops().all_reduce_sum(aten.mm(la, _ops().local_chunk(lb, mesh, 0, n)), mesh), mesh, None, 1)
    # (0, 0), (0, 1): gather the right operand; (1, 1): gather the left one.
    if da == 0:
        return _mm(a, _wrap(_ops().all_gather(lb, mesh, db, n), mesh, None, 1))
    return _mm(_wrap(_ops().all_gather(la, mesh, da, n), mesh, None, 1), b)


@_rule(aten.mm.default)
def _mm_rule(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _mm(*args)


@_rule(aten.addmm.default)
def _addmm_rule(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bias, a, b = args
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    out = _mm(a, b)
    if alpha != 1:
        out = aten.mul.Tensor(out, alpha)
    if beta == 0:
        return out
    return aten.add.Tensor(out, bias if beta == 1 else aten.mul.Tensor(bias, beta))


def _reduce_dims(x: torch.Tensor, dims: Any) -> list[int]:
    if dims is None or len(dims) == 0:
        return list(range(x.dim()))
    return sorted({d % max(x.dim(), 1) for d in dims})


@_rule(aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim)
def _reduction(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    is_mean = func.overloadpacket is aten.mean
    with_dims = func in (aten.sum.dim_IntList, aten.mean.dim)
    dims = _reduce_dims(x, args[1] if with_dims and len(args) > 1 else kwargs.get("dim"))
    keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False)) if with_dims else False
    dtype = kwargs.get("dtype")
    d = x._shard_dim
    if d not in dims:
        new_d = d if keepdim else d - sum(1 for i in dims if i < d)
        local = func(x._local, *args[1:], **kwargs)
        return _wrap(local, x._mesh, new_d, _num_shards(x))
    total = aten.sum.dim_IntList(x._local, dims, keepdim, dtype=dtype)
    out = _ops().all_reduce_sum(total, x._mesh)
    if is_mean:
        out = aten.div.Scalar(out, math.prod(x.shape[i] for i in dims))
    return _wrap(out, x._mesh, None, 1)


@ShardedTensor.implements(_redistribute_op._opoverload)
def _redistribute_rule(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, target, n = args
    src, mesh = x._shard_dim, x._mesh
    if target is not None:
        _check_shard_dim(ShardedTensor, x._local, target)
    if src == target:
        return _wrap(x._local.clone(), mesh, src, n)
    full = x._local if src is None else _ops().all_gather(x._local, mesh, src, n)
    if target is None:
        return _wrap(full, mesh, None, 1)
    return _wrap(_ops().local_chunk(full, mesh, target, n), mesh, target, n)
