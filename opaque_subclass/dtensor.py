"""One compilation per job for torch's ``DTensor``: :func:`share_compiles`.

A compiled DTensor program names its process groups by constant strings: while
AOTAutograd traces DTensor's sharding propagation, each redistribution becomes
a functional collective such as ``_c10d_functional.all_reduce(x, 'sum', '9')``,
``'9'`` being *this* rank's tensor-parallel group. The graph, and with it
every compile-cache entry, is then valid on this rank only, and a job of W
ranks compiles W times.

Under :func:`share_compiles` (or with :func:`compile_options` passed to
``torch.compile``), inductor runs :class:`MeshGroupPass` on each joint graph,
before the forward and backward are partitioned. The pass finds, for every
collective on a constant group, the ``DeviceMesh`` graph input and mesh
dimension whose group it is (DTensor's meshes are graph inputs on torch 2.12
and later, and on 2.11 with the library), and replaces the collective by a
custom op of the library that takes that mesh and dimension and looks up
``mesh.get_group(dim)`` when it runs. No group name is left in the graph, so
the graph is right for any mesh of the same shape; AOTAutograd's cache key
then holds each ``DeviceMesh`` input by its shape, dimension names and device
type instead of by value (:func:`opaque_subclass.fixes.autograd_cache.shared_mesh_inputs`),
and every rank of a job finds the entry the first one wrote.

What the pass refuses (:class:`ShareCompilesError`, the compilation stops):
a collective whose group belongs to no mesh input of the graph (a group
captured some other way), a mesh kept as a graph constant that is no input,
and a graph that used this rank's position in a mesh input while it was
traced (:func:`refuse_rank_positions`: DTensor picking this rank's chunk). It
never leaves a graph that would run a collective on the group of the rank
that compiled it, or compute that rank's part on another.

The custom ops run the functional collective and wait for it, so a collective
no longer overlaps with the computation that follows it in the graph (inductor
cannot reorder an op it does not know): the price of one compilation per job.

torch 2.11 runs the pass too (the collectives take their groups from the mesh
inputs), but its AOTAutograd cache refuses DTensor graphs (Dynamo puts
``from_local`` / ``redistribute`` / ``to_local`` in them as closures), so each
rank still compiles there (docs/large_jobs.md, "Limits").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.distributed.device_mesh import DeviceMesh

from opaque_subclass._version import __version__
from opaque_subclass.core.errors import OpaqueSubclassError
from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.core.registry import process_group_ranks, real_object
from opaque_subclass.sharded import messages

__all__ = [
    "MeshGroupPass",
    "ShareCompilesError",
    "compile_options",
    "mesh_ops",
    "refuse_rank_positions",
    "rewrite_collectives",
    "share_compiles",
]

#: The library namespace of the ops the pass puts in place of collectives.
NAMESPACE = "opaque_subclass"

# The collectives that name their group by a string, as torch's schemas read without the
# group (the last argument of all of them): the arguments before it, and the result.
_SCHEMAS = (
    "_c10d_functional::all_reduce(Tensor input, str reduce_op) -> Tensor",
    "_c10d_functional::all_gather_into_tensor(Tensor input, int group_size) -> Tensor",
    "_c10d_functional::reduce_scatter_tensor(Tensor input, str reduce_op, int group_size) -> Tensor",
    "_c10d_functional::all_to_all_single(Tensor input, SymInt[] output_split_sizes, SymInt[] input_split_sizes) -> Tensor",
    "_c10d_functional::broadcast(Tensor input, int src) -> Tensor",
    "_c10d_functional::all_reduce_coalesced(Tensor[] inputs, str reduce_op) -> Tensor[]",
    "_c10d_functional::all_gather_into_tensor_coalesced(Tensor[] inputs, int group_size) -> Tensor[]",
    "_c10d_functional::reduce_scatter_tensor_coalesced(Tensor[] inputs, str reduce_op, int group_size) -> Tensor[]",
    "_dtensor::shard_dim_alltoall(Tensor input, int gather_dim, int shard_dim) -> Tensor",
)


def _parsed(schema: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """``((namespace, name), (the arguments before the group, the result))`` of a schema."""
    qualified, _, rest = schema.partition("(")
    namespace, _, name = qualified.partition("::")
    leading, _, result = rest.partition(") -> ")
    return (namespace, name), (leading, result)


_COLLECTIVES: dict[tuple[str, str], tuple[str, str]] = dict(map(_parsed, _SCHEMAS))


class ShareCompilesError(OpaqueSubclassError):
    """A graph compiled under :func:`share_compiles` runs a collective whose
    process group cannot be found again from the graph's inputs on another rank."""


def _op_name(namespace: str, name: str) -> str:
    return f"mesh_{name}" if namespace == "_c10d_functional" else f"mesh_{namespace.strip('_')}_{name}"


def mesh_ops() -> dict[Any, Any]:
    """The library's op for each collective the pass replaces, defined on first use by
    importing :mod:`opaque_subclass.dtensor_ops` (Python imports it once; a thread that
    asks while another imports it waits for that import)."""
    from opaque_subclass import dtensor_ops

    return dtensor_ops.OPS


def _group_names(mesh: DeviceMesh) -> list[str]:
    return [str(mesh.get_group(d).group_name) for d in range(mesh.ndim)]


def _group_ranks(name: str) -> str:
    ranks = process_group_ranks(name)
    return str(list(ranks)) if ranks is not None else "unknown ranks"  # another process's group: its name says enough


@functools.cache
def _own_uuid() -> str:
    """This module's name, the library's version and a digest of this file and of
    dtensor_ops.py (the ops the pass puts in graphs): read once, though the cache keys
    of every compilation ask for it."""
    here = Path(__file__)
    digest = hashlib.sha256(here.read_bytes() + here.with_name("dtensor_ops.py").read_bytes()).hexdigest()[:16]
    return f"{__name__}:{__version__}:{digest}"


class MeshGroupPass(CustomGraphPass):
    """Inductor joint-graph pass (``torch._inductor.config.joint_custom_pre_pass``)
    that makes every collective of the graph take its group from a ``DeviceMesh``
    graph input. Runs ``inner`` (the pass configured before it, one pass or a
    list) first. Its :meth:`uuid` is part of inductor's and AOTAutograd's cache keys."""

    #: Read by AOTAutograd's cache key (opaque_subclass.fixes.autograd_cache):
    #: while this pass is configured, DeviceMesh inputs are keyed by shape.
    shares_compiles_across_ranks = True

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        mesh_ops()  # defined now: a program loaded from the cache calls them without running the pass

    def _inner_passes(self) -> list[Any]:
        if self.inner is None:
            return []
        return list(self.inner) if isinstance(self.inner, (list, tuple)) else [self.inner]

    def uuid(self) -> Any:
        own = _own_uuid()
        inner = [p.uuid() if hasattr(p, "uuid") else None for p in self._inner_passes()]
        if any(u is None for u in inner):  # an inner pass torch cannot key: no caching, as torch does
            return None
        return (own, *inner)

    def __call__(self, graph: torch.fx.Graph) -> None:
        for p in self._inner_passes():
            p(graph)
        refuse_rank_positions(graph)
        rewrite_collectives(graph)


#: The fix row that keys AOTAutograd's cache by a mesh's shape under share_compiles (torch 2.12+).
_MESH_KEYED_CACHE = "opaque_subclass.fixes.autograd_cache:make_autograd_cache_key"


def refuse_rank_positions(graph: torch.fx.Graph) -> None:
    """Raise :class:`ShareCompilesError` when the compilation in progress used
    where this rank sits in a mesh input (its coordinate, its local rank) while
    AOTAutograd traced: the graph then computes this rank's part (DTensor picks
    a rank's chunk in a Replicate -> Shard redistribution, an uneven shard's
    size, a random op's offset), and another rank loading it would compute this
    rank's part instead of its own. Reading the coordinate only to learn whether
    the rank is in the mesh at all (``get_coordinate() is None``) is no use.

    Where the uses are not recorded (no fix row writes them on this torch) but
    AOTAutograd's cache would still hand the entry to other ranks, every graph
    with a mesh input is refused: nothing could tell a safe one."""
    uses = RECORDER.by_object("position_uses")
    unobserved = RECORDER.unobserved("position_uses")
    if unobserved is not None and RECORDER.installed(_MESH_KEYED_CACHE) and _mesh_inputs(graph):
        raise messages.positions_unobserved(ShareCompilesError, unobserved)
    for node, mesh in _mesh_inputs(graph):
        used = uses.get(id(mesh))
        if used:
            raise messages.positions_used(ShareCompilesError, node.name, mesh, used)


_O = TypeVar("_O")


def _inputs_of(graph: torch.fx.Graph, cls: type[_O]) -> list[tuple[torch.fx.Node, _O]]:
    """The graph's inputs whose real object is a ``cls`` (``DeviceMesh``; ``ProcessGroup``: a
    subclass's opaque group attribute, a group argument)."""
    found = []
    for node in graph.find_nodes(op="placeholder"):
        real = real_object(node.meta.get("val"))
        if isinstance(real, cls):
            found.append((node, real))
    return found


def _mesh_inputs(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, DeviceMesh]]:
    return _inputs_of(graph, DeviceMesh)


def _constant_meshes(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, DeviceMesh]]:
    gm = graph.owning_module
    found = []
    for node in graph.find_nodes(op="get_attr"):
        real = real_object(getattr(gm, str(node.target), None)) if gm is not None else None
        if isinstance(real, DeviceMesh):
            found.append((node, real))
    return found


def _input_for_constant(mesh: DeviceMesh, inputs: Sequence[tuple[torch.fx.Node, DeviceMesh]]) -> torch.fx.Node | None:
    for node, real in inputs:
        if real is mesh:
            return node
    names = _group_names(mesh)
    for node, real in inputs:
        if real.ndim == mesh.ndim and _group_names(real) == names:
            return node
    return None


def rewrite_collectives(graph: torch.fx.Graph) -> int:
    """Replace each collective of ``graph`` on a constant group by the library's
    op taking the mesh input that has that group; returns how many were
    replaced. Raises :class:`ShareCompilesError` where no mesh input has it."""
    inputs = _mesh_inputs(graph)
    # a mesh DeviceMesh code captured as a constant: the input that is (or equals) it
    for node, mesh in _constant_meshes(graph):
        replacement = _input_for_constant(mesh, inputs)
        if replacement is None:
            raise messages.mesh_constant(ShareCompilesError, mesh, node.target)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
    # each group name -> (mesh input, its dimension) or (group input, None); a mesh input first
    by_group: dict[str, tuple[torch.fx.Node, int | None]] = {}
    for node, mesh in inputs:
        for dim, name in enumerate(_group_names(mesh)):
            by_group.setdefault(name, (node, dim))
    group_inputs = _inputs_of(graph, dist.ProcessGroup)
    for node, pg in group_inputs:
        by_group.setdefault(str(pg.group_name), (node, None))
    ops = None
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        key = (node.target.namespace, node.target._opname)
        if key not in _COLLECTIVES or not node.args or not isinstance(node.args[-1], str):
            continue
        group = node.args[-1]
        if group not in by_group:
            have = [(n.name, _group_names(m)) for n, m in inputs]
            have += [(n.name, [str(g.group_name)]) for n, g in group_inputs]
            raise messages.group_of_no_input(ShareCompilesError, key, group, _group_ranks(group), have)
        ops = ops if ops is not None else mesh_ops()
        source, mesh_dim = by_group[group]
        with graph.inserting_before(node):
            if mesh_dim is None:  # a ProcessGroup input: the op that takes the group itself
                new = graph.call_function(ops[key, "group"], (*node.args[:-1], source), dict(node.kwargs))
            else:
                new = graph.call_function(ops[key], (*node.args[:-1], source, mesh_dim), dict(node.kwargs))
        # the collective's output values and source; not its recorded eager arguments (other args)
        new.meta.update({k: v for k, v in node.meta.items() if k != "eager_input_vals"})
        for user in list(node.users):
            if user.op == "call_function" and user.target is torch.ops._c10d_functional.wait_tensor.default:
                user.replace_all_uses_with(new)
                graph.erase_node(user)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        replaced += 1
    if replaced:
        graph.lint()
    return replaced


def _config_value(current: Any) -> MeshGroupPass:
    if isinstance(current, MeshGroupPass):
        return current
    return MeshGroupPass(inner=current)


def compile_options() -> dict[str, Any]:
    """Inductor options for ``torch.compile(fn, options=compile_options())``:
    :func:`share_compiles` for that one compiled function."""
    from torch._inductor import config

    return {"joint_custom_pre_pass": _config_value(config.joint_custom_pre_pass)}


@contextlib.contextmanager
def share_compiles() -> Iterator[None]:
    """Compile DTensor programs once per job: inside the block, inductor
    compilations resolve each collective's process group from a ``DeviceMesh``
    graph input when they run, and AOTAutograd's cache keys a ``DeviceMesh`` by
    its shape, so every rank of a job finds the entry one rank wrote.

    The setting is inductor's configuration (``joint_custom_pre_pass``) for the
    whole process while the block runs; compile (the first call of a compiled
    function) inside it. For one function only, pass :func:`compile_options`
    to ``torch.compile``.
    """
    from torch._inductor import config

    with config.patch(joint_custom_pre_pass=_config_value(config.joint_custom_pre_pass)):
        yield
