"""The attribute list of a tangent against its forward output's (torch 2.11 -
2.15).

A compiled function's backward receives, for each subclass output, a tangent
(the gradient given to ``backward``). AOTAutograd checks that the tangent has
the output's type and an equal flatten context (else it asks the subclass's
``__coerce_same_metadata_as_tangent__``), then reads the tangent's leaves *by
the attribute names the forward output listed*: what the tangent's own
``__tensor_flatten__`` lists is compared only by length. A tangent listing
other names is read at the old names (a stale attribute, a stale opaque in
the gradient) or fails inside torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.checks import check_tangent_structure
from opaque_subclass.core.walk import is_wrapper_subclass, read_level
from opaque_subclass.patching import composes

__all__ = ["make_process_runtime_tangent", "opaque_slot_types"]


def opaque_slot_types() -> tuple[type, ...]:
    """The classes of torch's metas for an opaque slot: ``OpaqueMeta`` (torch
    2.12+), the backport's ``OpaqueSlotMeta`` (torch 2.11)."""
    found: list[type] = []
    try:
        from torch._functorch._aot_autograd.schemas import OpaqueMeta
    except ImportError:
        pass
    else:
        found.append(OpaqueMeta)
    from _opaque_subclass_pickle import OpaqueSlotMeta

    found.append(OpaqueSlotMeta)
    return tuple(found)


class _Paths(threading.local):
    """Per thread: the path of each inner value of the tangent being processed
    (keyed by ``id``), so torch's recursion into a nested level names it."""

    def __init__(self) -> None:
        self.by_id: dict[int, str] = {}


@composes
def make_process_runtime_tangent(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchAutograd.process_runtime_tangent``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15: each release's own fingerprint; on
    torch 2.11 the backport's opaque slots, on 2.12+ torch's own from
    pytorch/pytorch#176457), which turns each tangent given to a compiled
    backward into the leaves the backward graph takes.

    Without it, a subclass tangent whose ``__tensor_flatten__`` lists other
    attributes than the forward output did, with an equal flatten context
    (``out.backward(g)`` with ``g`` listing ``["_data", "_b"]`` where ``out``
    listed ``["_data", "_a"]``), is read at the output's names: the gradient
    carries the stale ``g._a`` (a wrong result, eager gives ``g._b``'s); a
    tangent without ``_a`` fails inside torch (``AttributeError: 'Flex' object
    has no attribute '_a'``), and a tensor where the output held an opaque
    fails with ``AssertionError: meta.memory_format must not be None`` (2.11)
    or is passed on silently (2.12+). With it, such a tangent is the library's
    ``OpaqueTypeError`` naming the subclass, the tangent's path, what it lists
    or holds and the fix; tangents that match reach torch's function
    unchanged, as do those torch coerces (another type or context).
    """
    import torch
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta
    from torch._subclasses.fake_tensor import FakeTensor

    opaque_slots = opaque_slot_types()
    paths = _Paths()
    compiling = torch.compiler.is_dynamo_compiling

    def process_runtime_tangent(x: Any, meta: Any, *args: Any, **kwargs: Any) -> Any:
        # Under compiled autograd Dynamo traces this function; the check runs on real tangents only.
        if (
            type(meta) is SubclassCreationMeta
            and is_wrapper_subclass(x)
            and not isinstance(x, FakeTensor)
            and not compiling()
        ):
            expected_type = meta.original_subclass_type or type(meta.original_subclass)
            path = paths.by_id.pop(id(x), None)
            if path is None:
                idx = args[0] if args else kwargs.get("tangent_idx")
                path = "tangent" if idx is None else f"tangents[{idx}]"
            level = read_level(x, path, strict=False)
            if type(x) is expected_type and level.ctx == meta.meta:  # else torch coerces, or refuses
                check_tangent_structure(
                    level, [(name, isinstance(sub, opaque_slots)) for name, sub in meta.attrs.items()]
                )
                nested = [id(a.value) for a in level.attrs if a.kind == "subclass"]
                if nested:
                    paths.by_id.update(
                        (i, a.path)
                        for i, a in zip(nested, (a for a in level.attrs if a.kind == "subclass"), strict=True)
                    )
                    try:
                        return original(x, meta, *args, **kwargs)
                    finally:
                        for i in nested:
                            paths.by_id.pop(i, None)
        return original(x, meta, *args, **kwargs)

    return process_runtime_tangent
