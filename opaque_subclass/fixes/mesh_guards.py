"""One compilation per mesh shape: a ``DeviceMesh`` is guarded on its rank map
only when the compilation read something rank-dependent from it
(torch 2.11 - 2.15).

torch (2.12+; the library likewise on 2.11) registers ``DeviceMesh`` with a
``guard_fn`` of its whole rank map, layout, device type, dimension names and
thread. So N meshes of one shape over other ranks (pipeline stages, expert
groups, a rebuilt mesh) compile N times, even when nothing reads the ranks (a
``ShardedTensor`` step finds its group when collectives run).

Reads of a mesh while compiling, and their guards:

* through Dynamo: a member value (``get_coordinate()``, ``size()``) is guarded
  on that value (:mod:`opaque_subclass.fixes.members`), an attribute
  (``_flatten_rank_map``, ``mesh``) by Dynamo's attribute guard;
* below Dynamo, while AOTAutograd traces (DTensor's sharding propagation, a
  dispatch reading the coordinate): recorded by
  :mod:`opaque_subclass.fixes.below_dynamo`, guarded only by the rank map.

So a mesh read below Dynamo only for its shape (:data:`SHAPE_MEMBERS`) is
guarded on layout, device type, dimension names and thread; any other read
(rank map, coordinate, group, submesh, equality), and every other opaque
class, keeps torch's guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.fixes.below_dynamo import reads_of
from opaque_subclass.patching import composes

__all__ = ["SHAPE_MEMBERS", "make_opaque_guard", "rank_dependent_reads"]

#: ``DeviceMesh`` members depending on its shape only, never its ranks (the narrow guard
#: compares everything they derive from).
SHAPE_MEMBERS = frozenset(
    {"size", "ndim", "shape", "device_type", "mesh_dim_names", "_device_type", "_mesh_dim_names", "_layout",
     "_thread_id", "_get_mesh_dim_by_name", "_preserve_rank_order"}
)  # fmt: skip


def _is_mesh(obj: object) -> bool:
    from torch.distributed.device_mesh import DeviceMesh

    return isinstance(obj, DeviceMesh)


def rank_dependent_reads(obj: object, context: object) -> frozenset[str]:
    """``obj``'s non-:data:`SHAPE_MEMBERS` members read below Dynamo in the compilation of ``context``."""
    read = reads_of(context).get(id(obj))
    return read[1] - SHAPE_MEMBERS if read is not None else frozenset()


def _compilation_of(builder: Any) -> object | None:
    """The ``TracingContext`` of ``builder``'s output graph, or ``None`` when unknown."""
    output_graph = getattr(getattr(builder, "check_fn_manager", None), "output_graph", None)
    return getattr(output_graph, "tracing_context", None)


def _shape_identity(mesh: Any) -> list[object]:
    """A mesh's layout (shape, strides), device type, dimension names and creating thread."""
    return [mesh._layout, mesh._device_type, mesh._mesh_dim_names, mesh._thread_id]


@composes
def make_opaque_guard(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15: each release's fingerprint), the
    guard Dynamo builds from a registered opaque's ``guard_fn``.

    Without it, a ``DeviceMesh`` input is guarded on its whole rank map (torch's
    ``guard_fn`` since 2.12, pytorch/pytorch#176457; the library's on 2.11): one
    program over 4 same-shape meshes on other ranks compiles 4 times. With it, a
    mesh with nothing rank-dependent read below Dynamo
    (:func:`rank_dependent_reads`, in a compilation known from the output graph)
    is guarded on layout, device type, dimension names and thread only; reads in
    the compiled function are guarded where read. Other meshes and opaque
    classes keep torch's guard.
    """

    def OPAQUE_OBJ_GUARD_FN_MATCH(self: Any, guard: Any) -> None:  # torch's guard names are upper case
        from torch._dynamo.guards import get_verbose_code_parts

        value = self.get(guard)
        context = _compilation_of(self)
        if not _is_mesh(value) or context is None or rank_dependent_reads(value, context):
            original(self, guard)  # torch's guard: the whole rank map
            return
        expected = _shape_identity(value)

        def mesh_shape_match(x: object) -> bool:
            return _is_mesh(x) and _shape_identity(x) == expected

        code = f"___check_mesh_shape_{id(mesh_shape_match)}"
        self.get_guard_manager(guard).add_lambda_guard(
            mesh_shape_match, get_verbose_code_parts(code, guard), guard.user_stack
        )

    # what torch attached to its method (2.12+: the check spec, read by guard serialization)
    vars(OPAQUE_OBJ_GUARD_FN_MATCH).update(vars(original))
    return OPAQUE_OBJ_GUARD_FN_MATCH
