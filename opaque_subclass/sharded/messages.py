"""The errors of :class:`~opaque_subclass.sharded.ShardedTensor`, its collectives and
:func:`~opaque_subclass.sharded.shard_module`, and of :func:`opaque_subclass.dtensor.share_compiles`,
one constructor per situation; the checks stay where they run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import torch

from opaque_subclass.core.errors import OpaqueSubclassError, OpaqueTypeError, OpaqueValueError, describe_type, subject

__all__ = [
    "collective_mesh_not_1d",
    "collective_mesh_size",
    "collective_not_divisible",
    "different_meshes",
    "different_shard_dims",
    "dim_out_of_range",
    "empty_shard",
    "expand_shard_dim",
    "from_full_not_divisible",
    "global_size_while_tracing",
    "group_of_no_input",
    "in_place_write",
    "mesh_constant",
    "mesh_not_1d",
    "no_attribute",
    "no_rule",
    "ops_first_used_compiling",
    "plan_names_missing",
    "positions_unobserved",
    "positions_used",
    "redistribute_plain",
    "shard_dim_not_int",
    "shard_dim_out_of_range",
    "view_splits_shard_dim",
]

_E = TypeVar("_E", bound=Exception)

_SUBMESH_FIX = "Fix: pass a 1-D submesh, e.g. mesh['tp'] for a mesh with mesh_dim_names=('dp', 'tp')."


def no_attribute(module: str, name: str) -> AttributeError:
    return AttributeError(f"module {module!r} has no attribute {name!r}")


# ---------------------------------------------------------------------- ShardedTensor


def _sharded(text: str) -> OpaqueSubclassError:
    return OpaqueSubclassError(f"ShardedTensor: {text}")


def _unsplittable(size: object, dim: int, n: object, ranks: str, rest: str) -> str:
    return f"size {size} of dim {dim} does not split into {n} equal shards{ranks}. Fix: pad dim {dim} to a multiple of {n}{rest}"


def redistribute_plain(shard_dim: int) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"redistribute(shard_dim={shard_dim}) got a plain tensor, which has no mesh. Fix: "
        "shard it with ShardedTensor.from_full(tensor, mesh, shard_dim)."
    )


def mesh_not_1d(cls: type, ndim: int) -> OpaqueValueError:
    return OpaqueValueError(
        f"{subject(cls)}._mesh: a {ndim}-d DeviceMesh was given; ShardedTensor shards over a 1-D mesh. " + _SUBMESH_FIX
    )


def global_size_while_tracing(cls: type) -> OpaqueSubclassError:
    return OpaqueSubclassError(
        f"{subject(cls)}: cannot compute the global size while tracing (the mesh "
        "is a fake). Fix: pass outer_size=, or build shards outside the compiled region."
    )


def from_full_not_divisible(cls: type, size: int, dim: int, n: int) -> OpaqueValueError:
    rest = _unsplittable(size, dim, n, f" (the mesh has {n} ranks)", ", or shard another dim.")
    return OpaqueValueError(f"{subject(cls)}.from_full: " + rest)


def no_rule(cls: type, func: Any, dim: int) -> OpaqueSubclassError:
    op = f"torch.ops.{func.namespace}.{func.__name__}"
    return OpaqueSubclassError(
        f"{subject(cls)} has no rule for {func} on a tensor sharded along dim {dim}. Fix: make it replicated first "
        f"with x.redistribute(None), or register a rule with @ShardedTensor.implements({op})."
    )


def shard_dim_not_int(cls: type, dim: object) -> OpaqueTypeError:
    rest = f"must be an int or None (replicated), got {describe_type(dim)}. Fix: pass the dim as an int, e.g. 0."
    return OpaqueTypeError(f"{subject(cls)}._shard_dim {rest}")


def shard_dim_out_of_range(cls: type, dim: int, ndim: int) -> OpaqueValueError:
    fix = f"pass {dim % ndim}" if ndim and -ndim <= dim < 0 else "pass a dim in range, or None for replicated"
    return OpaqueValueError(
        f"{subject(cls)}._shard_dim is {dim}, outside [0, {ndim}) for a {ndim}-d shard. Fix: {fix}."
    )


def empty_shard(cls: type, dim: int) -> OpaqueValueError:
    return OpaqueValueError(
        f"{subject(cls)}._local has size 0 along the shard dim {dim}; empty shards are not "
        "supported. Fix: shard a dim whose size is at least the mesh size."
    )


def different_meshes(func: Any) -> OpaqueSubclassError:
    return _sharded(
        f"{func} got arguments on different DeviceMesh objects; a collective needs one process group. Fix: "
        "re-shard one onto the other's mesh, ShardedTensor.from_full(x.full_tensor(), mesh, x.shard_dim)."
    )


def different_shard_dims(func: Any, dim: int, aligned: int, suggested: int) -> OpaqueSubclassError:
    return _sharded(
        f"{func} got arguments sharded along different dims ({dim} and {aligned}, aligned as in broadcasting). "
        f"Fix: bring one to the other's sharding, e.g. y.redistribute({suggested})."
    )


def in_place_write(func: Any, dim: int | None, name: str, arg: Any, sharded: bool) -> OpaqueSubclassError:
    """``arg`` (a ``ShardedTensor`` when ``sharded``) would take a result placed along ``dim``."""
    result = "a replicated result" if dim is None else f"a result sharded along dim {dim}"
    if sharded:
        own = arg._shard_dim
        shown = "replicated ShardedTensor" if own is None else f"ShardedTensor sharded along dim {own}"
    else:
        shown = "plain tensor" if isinstance(arg, torch.Tensor) else describe_type(arg)
    return _sharded(
        f"in-place {func} would write {result} into {name!r}, a {shown}. Fix: use the out-of-place op and keep its result."
    )


def expand_shard_dim(func: Any, size: list[Any], shard_dim: int, shape: list[Any]) -> OpaqueSubclassError:
    return _sharded(
        f"{func} to {size} would expand the shard dim {shard_dim} of a tensor of shape {shape}. "
        "Fix: call x.redistribute(None) first."
    )


def view_splits_shard_dim(func: Any, shape: list[Any], size: list[Any], dim: int) -> OpaqueSubclassError:
    return _sharded(
        f"{func} from {shape} to {size} splits or merges the shard dim {dim}. "
        f"Fix: keep dim {dim} whole in the new shape, or call x.redistribute(None) first."
    )


def plan_names_missing(missing: list[str], module: object) -> ValueError:
    return ValueError(
        f"shard_module: the plan names {missing}, which are not parameters of {type(module).__qualname__}"
    )


# ---------------------------------------------------------------------- the collectives


def _collective(op: str, text: str) -> OpaqueValueError:
    return OpaqueValueError(f"opaque_subclass::{op}: {text}")


def collective_mesh_not_1d(op: str, ndim: int) -> OpaqueValueError:
    return _collective(
        op, f"the DeviceMesh has {ndim} dimensions; ShardedTensor collectives use a 1-D mesh. " + _SUBMESH_FIX
    )


def collective_mesh_size(op: str, num_chunks: int, ranks: int) -> OpaqueValueError:
    return _collective(
        op,
        f"the tensor is split in {num_chunks} shards but its DeviceMesh has {ranks} ranks. Fix: build the "
        f"ShardedTensor on a mesh with {num_chunks} ranks, or re-shard it with ShardedTensor.from_full(full, mesh, "
        "shard_dim).",
    )


def dim_out_of_range(op: str, dim: int, ndim: int) -> OpaqueValueError:
    return _collective(op, f"dim {dim} is out of range for a {ndim}-d tensor")


def collective_not_divisible(op: str, size: int, dim: int, num_chunks: int) -> OpaqueValueError:
    return _collective(op, _unsplittable(size, dim, num_chunks, "", "."))


def ops_first_used_compiling() -> OpaqueSubclassError:
    return OpaqueSubclassError(
        "opaque_subclass collectives: the ops are defined on first use, and their first use "
        "is inside torch.compile, which cannot define them. Fix: call "
        "opaque_subclass.sharded.collectives.define_ops() before compiling (it also registers "
        "DeviceMesh as a reference opaque where torch has not), or build the ShardedTensor "
        "arguments outside the compiled function."
    )


# ---------------------------------------------------------------------- share_compiles (opaque_subclass.dtensor)

_OUTSIDE = "compile this function outside share_compiles()"


def positions_unobserved(error: type[_E], unobserved: str) -> _E:
    return error(
        f"share_compiles cannot tell whether this graph computes this rank's part: {unobserved}. AOTAutograd's "
        f"cache would serve it to every rank of the job. Fix: {_OUTSIDE} on this torch, or install a torch release "
        "the library supports in full (python -m opaque_subclass says which)."
    )


def positions_used(error: type[_E], input_name: str, mesh: object, used: Iterable[str]) -> _E:
    return error(
        "share_compiles: while the graph was traced, code below torch.compile's frame (DTensor's sharding and "
        "redistribution, a subclass's dispatch) used this rank's position in the DeviceMesh input "
        f"{input_name} ({mesh!r}): {', '.join(sorted(used))}. The graph computes this rank's part (a Replicate -> "
        "Shard redistribution picks this rank's chunk; an uneven shard or a random op depends on the coordinate), "
        f"so another rank loading it would compute the wrong part. Fix: {_OUTSIDE}, or keep the rank-dependent "
        "step (e.g. distribute_tensor / redistribute to Shard) out of the compiled function."
    )


def mesh_constant(error: type[_E], mesh: object, target: object) -> _E:
    return error(
        f"share_compiles: the compiled graph holds the DeviceMesh {mesh!r} as a constant ({target!r}), and no "
        "DeviceMesh input of the graph is that mesh: the graph would run on this rank's mesh on every rank. Fix: "
        f"pass the mesh to the compiled function (as the mesh of a DTensor input or as an argument), or {_OUTSIDE}."
    )


def group_of_no_input(
    error: type[_E], op: tuple[str, str], group: str, ranks: str, inputs: Sequence[tuple[str, list[str]]]
) -> _E:
    have = ", ".join(f"{name}: {groups}" for name, groups in inputs) or "none"
    return error(
        f"share_compiles: the compiled graph runs {op[0]}.{op[1]} on process group {group!r} ({ranks}), which is the group "
        f"of no DeviceMesh or ProcessGroup input of the graph (mesh inputs and their groups per dimension, group "
        f"inputs: {have}): shared with another rank, the graph would run it on this rank's group. Fix: give the "
        "collective a DeviceMesh or ProcessGroup the compiled function receives (an opaque attribute of a tensor "
        f"input; DTensor's redistribute takes its mesh), or {_OUTSIDE}."
    )
