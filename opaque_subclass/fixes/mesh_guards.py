"""One compilation per mesh shape: a ``DeviceMesh`` is guarded on its rank map
only when the compilation read something rank-dependent from it
(torch 2.11 - 2.15).

torch registers ``DeviceMesh`` (2.12+; the library registers it the same way on
2.11) with a ``guard_fn`` returning the mesh's whole rank map, layout, device
type, dimension names and thread, and guards every mesh input on it. So N
meshes of one shape over different ranks (pipeline stages, expert groups, a
mesh rebuilt after a failure) compile N times even when the program never reads
which ranks a mesh holds: a ``ShardedTensor`` step finds its process group when
its collectives run, never while tracing.

What a program can read from a mesh while it is compiled, and what guards it:

* in the compiled function, through Dynamo: a member value (``get_coordinate()``,
  ``get_local_rank()``, ``size()``) is guarded on that value
  (:mod:`opaque_subclass.fixes.members`), an attribute (``_flatten_rank_map``,
  ``mesh``) by Dynamo's guard on the attribute;
* below Dynamo, while AOTAutograd traces (DTensor's sharding propagation, a
  subclass reading its mesh's coordinate in its dispatch): recorded by
  :mod:`opaque_subclass.fixes.below_dynamo`; nothing guards those values but
  the rank-map guard.

So a mesh from which the compilation read only its shape below Dynamo
(:data:`SHAPE_MEMBERS`) is guarded on its layout, device type, dimension names
and thread; a mesh from which it read anything else (the rank map, a
coordinate, a group, a submesh, equality) keeps torch's guard, and so does
every other opaque class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.fixes.below_dynamo import reads_of
from opaque_subclass.patching import composes

__all__ = ["SHAPE_MEMBERS", "make_opaque_guard", "rank_dependent_reads"]

#: Members of ``DeviceMesh`` that depend on its shape only, never on which
#: ranks it holds (the narrow guard compares everything they derive from).
SHAPE_MEMBERS = frozenset(
    {"size", "ndim", "shape", "device_type", "mesh_dim_names", "_device_type", "_mesh_dim_names", "_layout",
     "_thread_id", "_get_mesh_dim_by_name", "_preserve_rank_order"}
)  # fmt: skip


def _is_mesh(obj: object) -> bool:
    from torch.distributed.device_mesh import DeviceMesh

    return isinstance(obj, DeviceMesh)


def rank_dependent_reads(obj: object, context: object) -> frozenset[str]:
    """The members of ``obj`` other than :data:`SHAPE_MEMBERS` read below
    Dynamo by the compilation whose ``TracingContext`` is ``context``."""
    read = reads_of(context).get(id(obj))
    return read[1] - SHAPE_MEMBERS if read is not None else frozenset()


def _compilation_of(builder: Any) -> object | None:
    """The ``TracingContext`` of the compilation whose guards ``builder`` builds
    (its output graph's), or ``None`` when it cannot be told."""
    output_graph = getattr(getattr(builder, "check_fn_manager", None), "output_graph", None)
    return getattr(output_graph, "tracing_context", None)


def _shape_identity(mesh: Any) -> list[object]:
    """What every compilation may depend on of a mesh: its layout (shape and
    strides), device type, dimension names and creating thread."""
    return [mesh._layout, mesh._device_type, mesh._mesh_dim_names, mesh._thread_id]


@composes
def make_opaque_guard(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.guards.GuardBuilder.OPAQUE_OBJ_GUARD_FN_MATCH``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15: each release's fingerprint), the
    guard Dynamo builds from a registered opaque's ``guard_fn``.

    Without it, a ``DeviceMesh`` input is guarded on its whole rank map (the
    ``guard_fn`` torch registers for it with its native opaques since 2.12,
    pytorch/pytorch#176457, and the library registers on 2.11): one program
    over 4 meshes of one shape on other ranks compiles 4 times although it
    never reads the ranks. With it, a mesh from which the compilation read
    nothing rank-dependent below Dynamo (:func:`rank_dependent_reads`; the
    compilation is told by the output graph whose guards are built, and when
    it cannot be told, torch's guard) is guarded on its layout, device type,
    dimension names and thread only; what the compiled function itself read
    from the mesh is guarded where it was read (a member's value, an
    attribute). Any other mesh, and every other opaque class, keeps torch's
    guard.
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

    # what torch attached to its method (2.12+: the guard's check spec, read by
    # its guard serialization), on the replacement too
    vars(OPAQUE_OBJ_GUARD_FN_MATCH).update(vars(original))
    return OPAQUE_OBJ_GUARD_FN_MATCH
