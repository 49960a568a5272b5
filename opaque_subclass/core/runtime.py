"""The run-time helpers: unwrap subclass arguments into a flat list, wrap a flat
list back into subclasses, and process tangents.

They follow AOTAutograd's conventions: a graph sees only the flat list of leaves
(plain tensors, reference opaques, optionally symbolic sizes), the user sees
subclasses, and opaques keep their slot in every structure:

* *inference* structures are a flat sequence of arguments;
* *joint* structures are a pair ``(primals, tangents)``, each flattened separately;
* a compiled forward may return extra *saved activations* after the user
  outputs; :func:`wrap_args` passes them through unwrapped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opaque_subclass.core import messages
from opaque_subclass.core.checks import check_tangent_structure
from opaque_subclass.core.codegen import compiled_unwrap, compiled_wrap
from opaque_subclass.core.flatten import append_leaves, flat_width, is_wrapper_subclass
from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.core.spec import Layout, OpaqueSlot, SubclassLayout, rebuild
from opaque_subclass.core.walk import read_level

__all__ = [
    "unwrap_args",
    "unwrap_tangent",
    "wrap_args",
    "wrap_args_maybe_joint",
]

_SCM = SubclassLayout


def _unwrap_flat(args: Sequence[Any], metas: Sequence[Layout] | None, append_symints: bool, what: str) -> list[Any]:
    out: list[Any] = []
    if metas is None:
        for i, x in enumerate(args):
            if is_wrapper_subclass(x):
                append_leaves(x, out, f"{what}[{i}]", symints=append_symints)
            else:
                out.append(x)
        return out
    if len(metas) != len(args):
        raise messages.unwrap_metas_count(len(args), len(metas), what)
    key = "unwrap+symints" if append_symints else "unwrap"
    extend = out.extend
    append = out.append
    try:
        for x, m in zip(args, metas, strict=True):
            if m.__class__ is _SCM:
                fn = m._compiled.get(key)
                if fn is None:
                    fn = compiled_unwrap(m, append_symints)
                extend(fn(x))
            else:
                append(x)
    except (TypeError, AttributeError, ValueError):
        # The generated unwrap names its argument "x" (it is cached per meta);
        # unwrap again, naming each argument as the path without metas does
        # (args[1]._data), to raise the same error under that name.
        _unwrap_named(args, metas, append_symints, what)
        raise
    return out


def _unwrap_named(args: Sequence[Any], metas: Sequence[Layout], append_symints: bool, what: str) -> None:
    for i, (x, m) in enumerate(zip(args, metas, strict=True)):
        if m.__class__ is _SCM:
            compiled_unwrap(m, append_symints)(x, f"{what}[{i}]")


def unwrap_args(
    wrapped_args: Any,
    *,
    is_joint_structure: bool,
    subclass_metas: Any = None,
    append_symints: bool = False,
) -> Any:
    """Replace every subclass argument by its leaves (tensors and opaques).

    Parameters
    ----------
    wrapped_args
        A sequence of arguments, or with ``is_joint_structure`` a pair ``(primals, tangents)`` of sequences.
    is_joint_structure
        Whether ``wrapped_args`` is a joint ``(primals, tangents)`` pair.
    subclass_metas
        Optional metas from :func:`describe_args` (a pair of lists for a joint structure). With
        metas, a generated straight-line unwrap per subclass is used, the fast path for code run
        on every call: it calls each level's ``__tensor_flatten__`` only to check its names are
        still the metadata's, reads the attributes by the metadata, and checks each slot (a
        tensor, a registered reference opaque); another structure is an error naming the path,
        never read at the old names. Without, each subclass is inspected and validated.
    append_symints
        Append each subclass's symbolic sizes/strides after its leaves (primals only; tangents
        share the primals' symbols).

    Returns
    -------
    A flat list, or for a joint structure a pair of flat lists.
    """
    if not is_joint_structure:
        if not isinstance(wrapped_args, (list, tuple)):
            raise messages.unwrap_args_not_a_list(wrapped_args)
        return _unwrap_flat(wrapped_args, subclass_metas, append_symints, "args")
    primals, tangents = _split_joint(wrapped_args, "unwrap_args")
    p_metas, t_metas = (None, None) if subclass_metas is None else _split_joint(subclass_metas, "subclass_metas")
    return (
        _unwrap_flat(primals, p_metas, append_symints, "primals"),
        _unwrap_flat(tangents, t_metas, False, "tangents"),
    )


def _split_joint(pair: Any, what: str) -> tuple[Sequence[Any], Sequence[Any]]:
    if not (
        isinstance(pair, (tuple, list))
        and len(pair) == 2
        and isinstance(pair[0], (list, tuple))
        and isinstance(pair[1], (list, tuple))
    ):
        raise messages.joint_not_a_pair(what, pair)
    return pair[0], pair[1]


def wrap_args(
    unwrapped_args: Sequence[Any],
    *,
    subclass_metas: Sequence[Layout],
    num_fw_outs_saved_for_bw: int | None = None,
    is_runtime: bool = False,
) -> tuple[Any, ...]:
    """Rebuild subclasses from a flat list, one value per meta.

    Parameters
    ----------
    unwrapped_args
        The flat list (leaves in the slots the metas name).
    subclass_metas
        One meta per value to produce, from :func:`describe_args`.
    num_fw_outs_saved_for_bw
        That many extra values (activations saved for backward) following the metas' slots,
        returned unchanged after the wrapped values.
    is_runtime
        ``True`` at run time: a generated function per subclass rebuilds it, reading symbolic sizes
        from their slots. ``False`` while tracing: outer sizes come from the metas and autograd
        metadata is mirrored from the original (fake) subclass.
    """
    wrapped: list[Any] = []
    append = wrapped.append
    tallied = 0
    try:
        for m in subclass_metas:
            if m.__class__ is _SCM:
                if is_runtime:
                    fn = m._compiled.get("wrap")
                    if fn is None:
                        fn = compiled_wrap(m)
                    append(fn(unwrapped_args))
                else:
                    append(rebuild(m, unwrapped_args, is_runtime=False))
                tallied += m.arg_count
            else:
                append(unwrapped_args[m.unwrapped_idx])  # type: ignore[union-attr]  # Plain/OpaqueSlot
                tallied += 1
    except IndexError:
        _raise_width(subclass_metas, unwrapped_args, num_fw_outs_saved_for_bw)
        raise
    if num_fw_outs_saved_for_bw is None:
        if len(unwrapped_args) != tallied:
            _raise_width(subclass_metas, unwrapped_args, None)
        return tuple(wrapped)
    if len(unwrapped_args) != tallied + num_fw_outs_saved_for_bw:
        _raise_width(subclass_metas, unwrapped_args, num_fw_outs_saved_for_bw)
    return (*wrapped, *unwrapped_args[tallied:])


def _raise_width(metas: Sequence[Layout], flat: Sequence[Any], saved: int | None) -> None:
    raise messages.wrap_width(flat_width(metas), saved, len(flat))


def wrap_args_maybe_joint(
    unwrapped_args: Any,
    *,
    is_joint_structure: bool,
    inp_metas: Sequence[Layout],
    tangent_metas: Sequence[Layout] | None = None,
    is_runtime: bool = False,
) -> Any:
    """:func:`wrap_args` for an inference list, or a joint ``(primals, tangents)`` pair wrapped with
    ``inp_metas`` and ``tangent_metas``."""
    if not is_joint_structure:
        return wrap_args(unwrapped_args, subclass_metas=inp_metas, is_runtime=is_runtime)
    if tangent_metas is None:
        raise messages.joint_without_tangent_metas()
    primals, tangents = _split_joint(unwrapped_args, "wrap_args_maybe_joint")
    return (
        wrap_args(primals, subclass_metas=inp_metas, is_runtime=is_runtime),
        wrap_args(tangents, subclass_metas=tangent_metas, is_runtime=is_runtime),
    )


def _coerce_layout(x: torch.Tensor, fmt: torch.memory_format | None) -> torch.Tensor:
    if fmt is not None and not x.is_contiguous(memory_format=fmt):
        return x.contiguous(memory_format=fmt)
    return x


def unwrap_tangent(x: Any, meta: Layout, *, name: str = "tangent") -> tuple[Any, list[Any]]:
    """Bring a run-time tangent to the layout of its forward output; return its leaves.

    Parameters
    ----------
    x
        The tangent (gradient of one forward output) given at run time.
    meta
        The meta of that forward output (made with ``with_memory_format=True`` for layout coercion).
    name
        What to call ``x`` in error messages.

    Returns
    -------
    (tangent, leaves)
        The possibly coerced tangent and its flat leaves. Tensor slots are made contiguous in the
        forward output's memory format; opaque slots (never differentiable) pass through, keeping
        their slot so the flat tangent list lines up with the tangent metas.

    A tangent whose subclass type or flatten context differs from the forward output's is converted
    with ``__coerce_same_metadata_as_tangent__`` when defined, else rejected with a :class:`TypeError`.
    """
    if not isinstance(x, torch.Tensor):
        return x, [x]
    if isinstance(meta, OpaqueSlot):
        raise messages.tangent_of_opaque(name, meta.opaque_type)
    if isinstance(meta, _SCM):
        expected_type: type = meta.subclass_type
        expected_ctx = meta.meta
        fmt = meta.memory_format
    else:
        expected_type, expected_ctx, fmt = torch.Tensor, None, meta.memory_format
    is_sub = is_wrapper_subclass(x)
    runtime_type = type(x) if is_sub else torch.Tensor
    runtime_ctx = read_level(x, name, strict=False).ctx if is_sub else None
    if runtime_type is not expected_type or runtime_ctx != expected_ctx:
        coerce = getattr(x, "__coerce_same_metadata_as_tangent__", None)
        if coerce is None:
            raise messages.tangent_metadata_differs(name, runtime_type, runtime_ctx, expected_type, expected_ctx)
        coerced = coerce(expected_ctx) if runtime_type is expected_type else coerce(expected_ctx, expected_type)
        if coerced is None or (
            type(coerced) is not expected_type
            and not (expected_type is torch.Tensor and not is_wrapper_subclass(coerced))
        ):
            raise messages.tangent_coerced_wrong(name, runtime_type, coerced, expected_type)
        x = coerced
    x = _coerce_layout(x, fmt)
    if not isinstance(meta, _SCM):
        return x, [x]
    level = read_level(x, name, strict=False)
    if level.names != tuple(meta.attrs):
        # read at the output's names, a tangent listing others would give stale leaves
        check_tangent_structure(level, [(n, isinstance(s, OpaqueSlot)) for n, s in meta.attrs.items()])
    leaves: list[Any] = []
    for attr, sub in meta.attrs.items():
        value = getattr(x, attr)
        if not isinstance(sub, OpaqueSlot) and not isinstance(value, torch.Tensor):
            raise messages.tangent_slot_not_a_tensor(name, attr, value)
        if isinstance(sub, OpaqueSlot):
            if isinstance(value, torch.Tensor) or opaque_kind(value) != "reference":
                raise messages.tangent_slot_not_an_opaque(name, attr, value)
            leaves.append(value)
            continue
        new_value, sub_leaves = unwrap_tangent(value, sub, name=f"{name}.{attr}")
        if new_value is not value:
            setattr(x, attr, new_value)
        leaves.extend(sub_leaves)
    return x, leaves
