"""AOTAutograd's per-call subclass unwrap/wrap (torch 2.11).

torch 2.11 unwraps subclass inputs and wraps outputs with data-driven loops
(``__tensor_flatten__`` and a dict per subclass per call), most of the per-call
overhead with opaques; torch 2.12+ generates straight-line code. The patch gives
``AOTDispatchSubclassWrapper``'s per-call function two functions generated once
per graph by :class:`opaque_subclass.core.codegen.ArgumentsPlan`, from torch's
metas translated into :class:`opaque_subclass.SubclassLayout`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.backport import messages
from opaque_subclass.core.codegen import ArgumentsPlan
from opaque_subclass.core.errors import OpaqueTypeError
from opaque_subclass.core.spec import Layout, OpaqueSlot, SubclassLayout, TensorSlot
from opaque_subclass.core.weak import remember

__all__ = [
    "make_saved_values_unwrap",
    "make_subclass_wrapper_post_compile",
    "make_wrap_tensor_subclasses",
    "plan_for",
    "translate",
]


def translate(torch_meta: Any, start: int | None = None, attr: str | None = None) -> SubclassLayout:
    """Our meta for a torch 2.11 runtime ``SubclassCreationMeta`` (once per graph, never stored on it)."""
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM

    from _opaque_subclass_pickle import OpaqueSlotMeta

    first = torch_meta.flat_tensor_start_idx if start is None else start
    idx = first
    attrs: dict[str, Layout] = {}
    for name, sub in torch_meta.attrs.items():
        if isinstance(sub, TorchSCM):
            ours = translate(sub, idx, name)
            idx += ours.arg_count
            attrs[name] = ours
        elif isinstance(sub, OpaqueSlotMeta):
            attrs[name] = OpaqueSlot(idx, name, object)  # the type is not kept at run time
            idx += 1
        else:
            attrs[name] = TensorSlot(idx, name)
            idx += 1
    cls = torch_meta.original_subclass_type or type(torch_meta.original_subclass)
    result = SubclassLayout(
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
        raise messages.translated_width(cls, result.arg_count, torch_meta.arg_count)
    return result


def _has_opaque_slot(torch_metas: list[Any]) -> bool:
    """Whether any of torch 2.11's runtime metas (recursively) has an opaque slot."""
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM

    from _opaque_subclass_pickle import OpaqueSlotMeta

    todo = [m for m in torch_metas if type(m) is TorchSCM]
    while todo:
        meta = todo.pop()
        for sub in meta.attrs.values():
            if isinstance(sub, OpaqueSlotMeta):
                return True
            if isinstance(sub, TorchSCM):
                todo.append(sub)
    return False


def plan_for(torch_metas: list[Any]) -> ArgumentsPlan:
    """The generated plan for a torch 2.11 list of runtime metas."""
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM

    ours: list[Layout] = [translate(m) if type(m) is TorchSCM else TensorSlot(m.unwrapped_idx) for m in torch_metas]
    return ArgumentsPlan(ours)


def make_subclass_wrapper_post_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``AOTDispatchSubclassWrapper.post_compile`` (torch 2.11), which
    builds the function run on every call of a compiled graph that takes or
    returns subclasses.

    Without it, each call runs torch 2.11's generic loops (``__tensor_flatten__``
    and a ``creation_fn`` walk per subclass). With it, two straight-line
    functions generated once per graph unwrap and wrap, as torch 2.12+ does
    (opaque slots as in pytorch/pytorch#176457), with identical results. Graphs
    without opaques, and calls passing ``None`` for frozen parameters (inductor's
    freezing), keep torch's function.
    """
    import functools

    def post_compile(self: Any, compiled_fn: Callable[..., Any], aot_config: Any, *, runtime_metadata: Any) -> Any:
        generic = original(self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
        if self.maybe_subclass_meta is None or not _has_opaque_slot(
            [*runtime_metadata.subclass_inp_meta, *runtime_metadata.subclass_fw_graph_out_meta]
        ):
            return generic  # no opaque anywhere: torch's own per-call function, unchanged
        saved = self.num_fw_outs_saved_for_bw
        built: list[Any] = []

        def build() -> tuple[Any, Any, int]:
            inputs = plan_for(runtime_metadata.subclass_inp_meta)
            outputs = plan_for(runtime_metadata.subclass_fw_graph_out_meta)
            for meta in outputs.metas:
                if isinstance(meta, SubclassLayout) and not meta.included_subclass_symints:
                    raise AssertionError("output subclass metadata without symbolic-size slots")
            built.append((inputs.unwrap_function(True), outputs.wrap_function(), outputs.width))
            return built[0]  # type: ignore[no-any-return]  # just appended

        @functools.wraps(compiled_fn)
        def inner_fn(args: list[Any]) -> Any:
            unwrap, wrap, width = built[0] if built else build()
            try:
                flat = unwrap(args)
            except OpaqueTypeError:
                if any(a is None for a in args):
                    # Inductor's freezing passes frozen parameters as None, which the generated
                    # unwrap refuses at a subclass slot: torch's function skips them. Looked for
                    # only here, so a call without them pays no scan of its arguments.
                    return generic(args)
                raise
            args.clear()
            outs = compiled_fn(flat)
            extra = saved or 0
            if len(outs) != width + extra:
                raise messages.compiled_width(len(outs), width, extra)
            wrapped = wrap(outs)
            if saved is None:
                return wrapped
            return (*wrapped, *outs[width:])

        inner_fn._boxed_call = True  # type: ignore[attr-defined]  # torch's boxed-call marker
        return inner_fn

    return post_compile


def make_wrap_tensor_subclasses(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``subclass_utils.wrap_tensor_subclasses`` (torch 2.11), which
    rebuilds subclasses from flat leaves; at run time torch 2.11 calls it on
    every backward for the gradients (``_backward_epilogue_functional``).

    Without it, each backward of a graph whose inputs hold opaques rebuilds
    every gradient with torch 2.11's generic walk (a ``creation_fn`` per
    subclass, its outer size and stride recomputed, an import per call). With
    it, such gradients are built by one straight-line function generated once
    per list of metas (:class:`opaque_subclass.core.codegen.ArgumentsPlan`,
    opaque slots as in pytorch/pytorch#176457), as torch 2.12+ generates its
    backward wrapper, with identical results. Calls while tracing, with saved
    activations, with a ``make_subclass_override``, or on metas without
    opaques keep torch's function.
    """
    import torch
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM

    compiling = torch.compiler.is_dynamo_compiling
    # id(metas) -> (weak reference to its first subclass meta, that meta's index, the generated
    # wrap and width, or None)
    plans: dict[int, tuple[Any, int, tuple[Callable[[Any], tuple[Any, ...]], int] | None]] = {}

    def plan_of(
        metas: list[Any], included_subclass_symints: bool
    ) -> tuple[Callable[[Any], tuple[Any, ...]], int] | None:
        entry = plans.get(id(metas))
        if entry is not None:
            first_ref, index, built = entry
            if index < len(metas) and metas[index] is first_ref():
                return built
        index = next((i for i, m in enumerate(metas) if type(m) is TorchSCM), -1)
        if index < 0:
            return None
        first = metas[index]
        built = None
        if _has_opaque_slot(metas) and all(
            m.included_subclass_symints == included_subclass_symints for m in metas if type(m) is TorchSCM
        ):
            plan = plan_for(metas)
            built = (plan.wrap_function(), plan.width)
        remember(plans, id(metas), first, index, built)
        return built

    def wrap_tensor_subclasses(
        unwrapped_args: Any,
        *,
        subclass_metas: Any,
        num_fw_outs_saved_for_bw: Any = None,
        included_subclass_symints: bool = False,
        is_runtime: bool = False,
        make_subclass_override: Any = None,
    ) -> Any:
        if is_runtime and num_fw_outs_saved_for_bw is None and make_subclass_override is None and not compiling():
            built = plan_of(subclass_metas, included_subclass_symints)
            if built is not None and len(unwrapped_args) == built[1]:
                return built[0](unwrapped_args)
        return original(
            unwrapped_args,
            subclass_metas=subclass_metas,
            num_fw_outs_saved_for_bw=num_fw_outs_saved_for_bw,
            included_subclass_symints=included_subclass_symints,
            is_runtime=is_runtime,
            make_subclass_override=make_subclass_override,
        )

    return wrap_tensor_subclasses


def _never_a_wrapper_subclass(cls: type) -> bool:
    """Whether no instance of ``cls`` can pass torch's ``is_traceable_wrapper_subclass``: ``cls`` is
    ``Tensor`` itself or a builtin number, or no tensor class whose instances report their own
    class (nothing in its MRO but ``object`` defines ``__class__`` or ``__getattribute__``, so
    ``isinstance(x, Tensor)`` is False). Any other class (a tensor subclass, a class with its own
    attribute lookup) is left to torch's function."""
    import torch

    if cls is torch.Tensor or cls in (int, float, bool, type(None)):
        return True
    if issubclass(cls, torch.Tensor):
        return False
    return not any("__class__" in vars(k) or "__getattribute__" in vars(k) for k in cls.__mro__[:-1])


def make_saved_values_unwrap(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.runtime_wrappers.runtime_unwrap_tensor_subclasses``
    (torch 2.11): the run-time module's own import of
    ``subclass_utils.runtime_unwrap_tensor_subclasses``, and only that import (torch's function is
    unchanged). Its per-call use there: every backward of a graph with subclass tangents passes
    the values its forward saved (tensors, symbolic sizes, opaques) through it, twice, before and
    after the tangents.

    Without it, each backward walks the saved values in Python, one
    ``is_traceable_wrapper_subclass`` call per value (an ``isinstance`` and two ``hasattr``): a
    saved mesh per subclass input with an opaque, so the walk grows with the number of inputs
    (about 1,100 bytecode instructions per backward with 64 such inputs). The values saved by a
    graph traced on plain tensors are plain (the opaques among them are the slots of
    pytorch/pytorch#176457), and torch 2.12+ generates ``list(args)`` for this step.

    With it, each value's class is looked up by C code (``all(map(...))``) in a table of the
    classes judged plain (``Tensor``, the builtin numbers, ``None``, and classes that are no
    tensor and report their own class; each judged on first sight), and when all are there the
    result is ``list(args)``, what torch's walk returns for such values. Calls with symbolic
    sizes to append, with subclass metas, or with a value of any other class are torch's
    function.
    """
    # id(class) -> (weak reference to it,) for each class judged plain; the entry leaves with the class
    plain: dict[int, tuple[Any, ...]] = {}
    is_plain = plain.__contains__

    def judged_plain(values: Any) -> bool:
        for cls in set(map(type, values)):
            if id(cls) not in plain:
                if not _never_a_wrapper_subclass(cls):
                    return False  # not kept: such a value goes to torch's walk on every call
                remember(plain, id(cls), cls)
        return True

    def runtime_unwrap_tensor_subclasses(
        wrapped_args: Any, *, append_symints: bool, subclass_metas: Any = None
    ) -> list[Any]:
        if (
            not append_symints
            and subclass_metas is None
            and (all(map(is_plain, map(id, map(type, wrapped_args)))) or judged_plain(wrapped_args))
        ):
            return list(wrapped_args)
        return original(  # type: ignore[no-any-return]
            wrapped_args, append_symints=append_symints, subclass_metas=subclass_metas
        )

    return runtime_unwrap_tensor_subclasses
