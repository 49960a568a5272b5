"""AOTAutograd's per-call subclass unwrap/wrap (torch 2.11).

Every call of a compiled function taking or returning subclasses unwraps the
inputs into the graph's flat list and wraps the flat outputs back. torch 2.11
does it with data-driven loops over its metadata (``__tensor_flatten__`` and a
dict per subclass on every call); torch 2.13 generates straight-line code. With
opaque attributes on 2.11, that loop is most of the per-call overhead. These
patches route the *run-time* calls through :mod:`opaque_subclass.codegen`: each
torch meta is translated once into an :class:`opaque_subclass.SubclassCreationMeta`
and a generated function does the work. Trace-time calls, calls without metas
and calls with a ``make_subclass_override`` keep torch's code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...codegen import compiled_unwrap, compiled_wrap
from ...errors import OpaqueSubclassError
from ...schema import OpaqueMeta, PlainTensorMeta, SlotMeta, SubclassCreationMeta
from ..patching import Patch
from .aot_autograd import OpaqueSlotMeta

__all__ = ["PATCHES", "translate"]

_OURS = "_opaque_subclass_meta"


def translate(torch_meta: Any, start: int | None = None, attr: str | None = None) -> SubclassCreationMeta:
    """Our meta for a torch 2.11 (runtime-safe) ``SubclassCreationMeta``, cached on it."""
    if start is None:
        cached = torch_meta.__dict__.get(_OURS)
        if cached is not None:
            return cached  # type: ignore[no-any-return]  # stored below
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM

    first = torch_meta.flat_tensor_start_idx if start is None else start
    idx = first
    attrs: dict[str, SlotMeta] = {}
    for name, sub in torch_meta.attrs.items():
        if isinstance(sub, TorchSCM):
            ours = translate(sub, idx, name)
            idx += ours.arg_count
            attrs[name] = ours
        elif isinstance(sub, OpaqueSlotMeta):
            attrs[name] = OpaqueMeta(idx, name, object)  # the type is not kept at run time
            idx += 1
        else:
            attrs[name] = PlainTensorMeta(idx, name)
            idx += 1
    cls = torch_meta.original_subclass_type or type(torch_meta.original_subclass)
    result = SubclassCreationMeta(
        flat_tensor_start_idx=first,
        attrs=attrs,
        meta=torch_meta.meta,
        outer_size=tuple(torch_meta.outer_size),
        outer_stride=tuple(torch_meta.outer_stride),
        subclass_type=cls,
        attr=attr,
        included_subclass_symints=torch_meta.included_subclass_symints,
    ).runtime_safe()
    if result.arg_count != torch_meta.arg_count:
        raise AssertionError(
            f"translated meta of {cls.__qualname__} takes {result.arg_count} slots, torch's takes "
            f"{torch_meta.arg_count}"
        )
    if start is None:
        torch_meta.__dict__[_OURS] = result
    return result


def make_runtime_unwrap(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``subclass_utils.runtime_unwrap_tensor_subclasses`` (torch 2.11).

    Without it, each call of a compiled function unwraps its subclass
    arguments with torch 2.11's generic loop (``__tensor_flatten__`` per
    argument per call). With it, when metadata is given, a generated
    straight-line unwrap per subclass reads the attributes directly, as the
    generated wrappers of torch 2.12+ do (opaque slots as in
    pytorch/pytorch#176457). Results are identical.
    """
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM

    def runtime_unwrap_tensor_subclasses(
        wrapped_args: list[Any], *, append_symints: bool, subclass_metas: list[Any] | None = None
    ) -> list[Any]:
        if subclass_metas is None:
            return original(wrapped_args, append_symints=append_symints, subclass_metas=subclass_metas)  # type: ignore[no-any-return]
        out: list[Any] = []
        extend, append = out.extend, out.append
        key = "unwrap+symints" if append_symints else "unwrap"
        for x, meta in zip(wrapped_args, subclass_metas):
            if type(meta) is TorchSCM:
                ours = meta.__dict__.get(_OURS) or translate(meta)
                fn = ours._compiled.get(key) or compiled_unwrap(ours, append_symints)
                extend(fn(x))
            else:
                append(x)
        return out

    return runtime_unwrap_tensor_subclasses


def make_wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``subclass_utils.wrap_tensor_subclasses`` (torch 2.11).

    Without it, each call rebuilds the output subclasses with torch 2.11's
    generic ``creation_fn`` (a dict and a recursive walk per subclass per
    call). With it, run-time wrapping uses a generated straight-line function
    per subclass, as in torch 2.12+ (opaque slots as in pytorch/pytorch#176457);
    trace-time wrapping and ``make_subclass_override`` keep torch's code.
    Results are identical.
    """
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM

    def wrap_tensor_subclasses(
        unwrapped_args: Sequence[Any],
        *,
        subclass_metas: list[Any],
        num_fw_outs_saved_for_bw: int | None = None,
        included_subclass_symints: bool = False,
        is_runtime: bool = False,
        make_subclass_override: Callable[..., Any] | None = None,
    ) -> tuple[Any, ...]:
        if not is_runtime or make_subclass_override is not None:
            return original(  # type: ignore[no-any-return]
                unwrapped_args,
                subclass_metas=subclass_metas,
                num_fw_outs_saved_for_bw=num_fw_outs_saved_for_bw,
                included_subclass_symints=included_subclass_symints,
                is_runtime=is_runtime,
                make_subclass_override=make_subclass_override,
            )
        wrapped: list[Any] = []
        append = wrapped.append
        tallied = 0
        for meta in subclass_metas:
            if type(meta) is TorchSCM:
                if meta.included_subclass_symints != included_subclass_symints:
                    raise AssertionError(
                        f"included_subclass_symints mismatch: {meta.included_subclass_symints} != {included_subclass_symints}"
                    )
                ours = meta.__dict__.get(_OURS) or translate(meta)
                fn = ours._compiled.get("wrap") or compiled_wrap(ours)
                append(fn(unwrapped_args))
                tallied += meta.arg_count
            else:
                append(unwrapped_args[meta.unwrapped_idx])
                tallied += 1
        extra = num_fw_outs_saved_for_bw or 0
        if len(unwrapped_args) != tallied + extra:
            raise OpaqueSubclassError(
                f"compiled graph returned {len(unwrapped_args)} flat values; its output metadata "
                f"describes {tallied} plus {extra} saved activations"
            )
        if num_fw_outs_saved_for_bw is None:
            return tuple(wrapped)
        return (*wrapped, *unwrapped_args[tallied:])

    return wrap_tensor_subclasses


_SU = "torch._functorch._aot_autograd.subclass_utils."

PATCHES = [
    Patch(_SU + "runtime_unwrap_tensor_subclasses", "6c67b34e3c9d3bbc", make_runtime_unwrap),
    Patch(_SU + "wrap_tensor_subclasses", "a34a0b2d6a810e7b", make_wrap),
]
