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

import keyword
import threading
import weakref
from collections.abc import Callable
from typing import Any, cast

from opaque_subclass.core.checks import check_tangent_structure
from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.core.walk import read_level
from opaque_subclass.core.weak import remember
from opaque_subclass.patching import composes

__all__ = ["make_process_runtime_tangent", "opaque_slot_types"]

_MISSING = object()
# Shared by every replacement this module makes (the library disabled and enabled again keeps
# them): types seen to be reference opaques (a kind never changes), and per output meta,
# id(meta) -> (weak reference to it, its generated one-pass tangent reader, the tangent type it
# reads; None, None where there is none).
_REFERENCE_TYPES: set[type] = set()
_READERS: dict[int, tuple[weakref.ref[Any], Callable[[Any], list[Any] | None] | None, type | None]] = {}


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
    or holds and the fix; tangents torch must coerce (another type, context
    or memory format) reach torch's function unchanged.

    Per call: a tangent that needs nothing from torch (the output's type,
    context, names and slot kinds at every level, each level and plain leaf
    already in the expected memory format) gets its leaves from one read-only
    pass here, without torch's function, which costs about 6 us per tangent
    (torch 2.13, benchmarks/bench_per_call.py); every other tangent takes
    torch's path, after the check above. That pass is straight-line code
    generated once per output meta (its names, context, slot kinds and
    layouts bound in: 64 bytecode instructions for a two-attribute tangent,
    against 220 for the general read); where it declines (another context,
    names, slot kind or layout), the general read decides.
    """
    import torch
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta

    opaque_slots = opaque_slot_types()
    paths = _Paths()
    compiling = torch.compiler.is_dynamo_compiling
    tensor = torch.Tensor

    reference_types = _REFERENCE_TYPES
    readers = _READERS
    # The one-pass read stands in for torch's own function only: over another package's
    # replacement (imported first), every tangent goes through it.
    code = getattr(original, "__code__", None)
    over_torchs = (
        code is not None
        and code.co_name == "process_runtime_tangent"
        and code.co_filename.replace("\\", "/").endswith("_aot_autograd/runtime_wrappers.py")
    )

    def in_format(t: Any, expected: Any) -> bool:
        """Whether torch would leave ``t`` as it is for this expected memory format."""
        if expected is None:
            return False  # torch refuses it: its own error
        if expected.memory_format is not None:
            return bool(t.is_contiguous(memory_format=expected.memory_format))
        return bool(t.shape == expected.size and t.stride() == expected.stride)

    def read(x: Any, meta: Any, ready: bool) -> tuple[bool | None, list[Any] | None]:
        """One ``__tensor_flatten__`` read of tangent ``x`` (of the output's type; this runs per
        tangent per backward call): whether it lists ``meta``'s names with a value of each slot's
        kind (``None`` when its context differs: torch coerces or refuses it), and, when ``ready``
        is asked and torch would change nothing at any level (memory formats included), its
        leaves; reads only."""
        names, ctx = x.__tensor_flatten__()
        attrs = meta.attrs
        if ctx != meta.meta:
            return None, None
        if len(names) != len(attrs):
            return False, None
        leaves: list[Any] | None = [] if ready and in_format(x, meta.memory_format) else None
        for name, (slot, sub) in zip(names, attrs.items(), strict=True):
            if name != slot:
                return False, None
            value = getattr(x, name, _MISSING)
            if isinstance(sub, opaque_slots):
                cls = type(value)
                if cls not in reference_types:
                    if isinstance(value, tensor) or opaque_kind(value) != "reference":
                        return False, None
                    reference_types.add(cls)
                if leaves is not None:
                    leaves.append(value)
            elif not isinstance(value, tensor):
                return False, None
            elif leaves is None:
                pass  # torch's recursion into this level checks it
            elif type(sub) is SubclassCreationMeta:
                inner = None
                if type(value) is (sub.original_subclass_type or type(sub.original_subclass)):
                    inner = read(value, sub, True)[1]
                if inner is None:
                    leaves = None
                else:
                    leaves.extend(inner)
            elif type(value) is tensor and in_format(value, sub.memory_format):
                leaves.append(value)
            else:
                leaves = None
        return True, leaves

    def format_test(var: str, expected: Any, namespace: dict[str, Any]) -> str | None:
        """``in_format`` for one expected memory format, as an expression on ``var``; ``None``
        when torch refuses every tensor for it (no expected format)."""
        if expected is None:
            return None
        key = f"f{len(namespace)}"
        if expected.memory_format is not None:
            namespace[key] = expected.memory_format
            return f"{var}.is_contiguous(memory_format={key})"
        namespace[key], namespace[key + "s"] = expected.size, expected.stride
        return f"({var}.shape == {key} and {var}.stride() == {key}s)"

    def emit_level(meta: Any, var: str, lines: list[str], namespace: dict[str, Any], out: list[str]) -> bool:
        """Lines reading tangent level ``var`` of ``meta`` into ``out`` (leaf expressions), each
        returning ``None`` where the one-pass read would not hand the leaves over as they are;
        ``False`` when no tangent of this level ever is."""
        level = f"m{len(namespace)}"
        namespace[level + "c"], namespace[level + "n"] = meta.meta, list(meta.attrs)
        fmt = format_test(var, meta.memory_format, namespace)
        if fmt is None:
            return False
        lines.append(f"    names, ctx = {var}.__tensor_flatten__()")
        lines.append(f"    if ctx != {level}c or names != {level}n or not {fmt}:")
        lines.append("        return None")
        for index, (name, sub) in enumerate(meta.attrs.items()):
            value = f"{var}_{index}"
            if name.isidentifier() and not keyword.iskeyword(name):
                lines.append(f"    {value} = {var}.{name}")
            else:
                namespace[f"{value}a"] = name
                lines.append(f"    {value} = getattr({var}, {value}a)")
            if isinstance(sub, opaque_slots):
                lines.append(f"    if type({value}) not in reference_types:")
                lines.append("        return None")
                out.append(value)
            elif type(sub) is SubclassCreationMeta:
                namespace[f"{value}t"] = sub.original_subclass_type or type(sub.original_subclass)
                lines.append(f"    if type({value}) is not {value}t:")
                lines.append("        return None")
                if not emit_level(sub, value, lines, namespace, out):
                    return False
            else:
                fmt = format_test(value, sub.memory_format, namespace)
                if fmt is None:
                    return False
                lines.append(f"    if type({value}) is not tensor or not {fmt}:")
                lines.append("        return None")
                out.append(value)
        return True

    def reader_for(meta: Any) -> tuple[Any, Callable[[Any], list[Any] | None] | None, type | None]:
        """``meta``'s entry of the readers: the one-pass read of its tangents as straight-line
        code, generated on first use, and the tangent type it reads (``None``, ``None`` when no
        tangent of it is ever read in one pass). The read returns the leaves, or ``None`` where
        the general read decides (another context, names, slot kind, format)."""
        namespace: dict[str, Any] = {"reference_types": reference_types, "tensor": tensor}
        lines: list[str] = ["def read_tangent(x):"]
        out: list[str] = []
        fast = owner = None
        if emit_level(meta, "x", lines, namespace, out):
            lines.append(f"    return [{', '.join(out)}]")
            exec(compile("\n".join(lines), f"<opaque_subclass tangent reader {id(meta):x}>", "exec"), namespace)
            fast = namespace["read_tangent"]
            owner = meta.original_subclass_type or type(meta.original_subclass)
        return remember(readers, id(meta), meta, fast, owner)

    def top_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        idx = args[0] if args else kwargs.get("tangent_idx")
        return "tangent" if idx is None else f"tangents[{idx}]"

    def process_runtime_tangent(x: Any, meta: Any, *args: Any, **kwargs: Any) -> Any:
        # Only a tangent of the output's own type is checked (another type is torch's to coerce
        # or refuse; a fake tensor is never of it). Under compiled autograd Dynamo traces this
        # function; the check runs on real tangents only.
        if type(meta) is not SubclassCreationMeta or compiling():
            return original(x, meta, *args, **kwargs)
        if over_torchs and not paths.by_id:
            # the generated one-pass read of this meta's tangents (generated on its first tangent)
            entry = readers.get(id(meta))
            if entry is None or entry[0]() is not meta:
                entry = reader_for(meta)
            if type(x) is entry[2]:
                try:
                    leaves = entry[1](x)  # type: ignore[misc]  # not None where entry[2] is a type
                except AttributeError:  # a name the tangent lacks: the general read names it
                    leaves = None
                if leaves is not None:
                    return x, leaves
        if type(x) is (meta.original_subclass_type or type(meta.original_subclass)):
            path = paths.by_id.pop(id(x), None) if paths.by_id else None
            same, ready = read(x, meta, over_torchs)
            if ready is not None:
                return x, ready
            if same is None:
                return original(x, meta, *args, **kwargs)
            if not same:  # walk it for the error naming what differs
                check_tangent_structure(
                    read_level(cast("torch.Tensor", x), path or top_path(args, kwargs), strict=False),
                    [(name, isinstance(sub, opaque_slots)) for name, sub in meta.attrs.items()],
                )
            nested = [name for name, sub in meta.attrs.items() if type(sub) is SubclassCreationMeta]
            if nested:  # name the inner levels for torch's recursion into them
                path = path or top_path(args, kwargs)
                inner = [id(getattr(x, name)) for name in nested]
                paths.by_id.update((i, f"{path}.{name}") for i, name in zip(inner, nested, strict=True))
                try:
                    return original(x, meta, *args, **kwargs)
                finally:
                    for i in inner:
                        paths.by_id.pop(i, None)
        return original(x, meta, *args, **kwargs)

    return process_runtime_tangent
