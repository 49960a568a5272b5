"""``nn.utils.parametrize`` with opaque objects in ``right_inverse`` (torch 2.11).

Since torch 2.12 (pytorch/pytorch#176457) a ``right_inverse`` sequence may hold
reference opaques, stored on the ``ParametrizationList`` as plain attributes
(``original1 = mesh``, not parameters or buffers) and handed back to
``forward`` as the same objects; torch 2.11 rejects any non-tensor element.
The same change taught torch's subclass parametrization
(``torch._functorch._aot_autograd.subclass_parametrization``, whose
``unwrap_tensor_subclass_parameters`` registers an ``UnwrapTensorSubclass`` on
each subclass parameter) to keep reference opaques of ``__tensor_flatten__``
as marked leaves; 2.11 takes them for tensors and fails. These patches give
2.11 both, and a value-type opaque a clear error.

Technique: while torch's ``ParametrizationList.__init__`` runs, a stand-in
replaces each opaque of the last ``right_inverse`` result by an empty
placeholder tensor; afterwards the opaques replace the placeholders as plain
attributes. Tensor-only parametrizations run torch's code unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from opaque_subclass.backport import messages
from opaque_subclass.core.errors import OpaqueValueError, subject
from opaque_subclass.core.flatten import flatten_subclass, is_wrapper_subclass
from opaque_subclass.core.registry import opaque_kind, stored_opaque_leaves
from opaque_subclass.core.spec import Layout, OpaqueSlot, SubclassLayout, TensorSlot
from opaque_subclass.core.walk import ValueOpaqueListedError

__all__ = ["make_init", "make_right_inverse", "make_unwrap_forward", "make_unwrap_right_inverse"]


def _split(result: Any, owner: str) -> tuple[Any, dict[int, Any]]:
    """Replace reference opaques in a right_inverse result by placeholders."""
    if isinstance(result, torch.Tensor) or not isinstance(result, Sequence):
        return result, {}
    opaques: dict[int, Any] = {}
    out = list(result)
    for i, value in enumerate(out):
        if isinstance(value, torch.Tensor):
            continue
        kind = opaque_kind(value)
        if kind == "value":
            raise messages.value_opaque_returned(owner, i, value)
        if kind is None:
            continue  # not ours: torch's own check reports it, with torch's message
        opaques[i] = value
        out[i] = torch.empty(0)
    return (type(result)(out) if isinstance(result, tuple) else out), opaques


class _RightInverseStandIn(torch.nn.Module):
    """A parametrization's stand-in while ``ParametrizationList`` is built (its ``forward``, our ``right_inverse``)."""

    _module: torch.nn.Module
    _right_inverse: Callable[[Any], Any]

    def __init__(self, module: torch.nn.Module, right_inverse: Callable[[Any], Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_module", module)  # not a submodule: never registered anywhere
        object.__setattr__(self, "_right_inverse", right_inverse)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)

    def right_inverse(self, value: Any) -> Any:
        return self._right_inverse(value)


def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``ParametrizationList.__init__`` (torch 2.11).

    Without it, a ``right_inverse`` returning a reference opaque fails ("must
    return a Tensor or a Sequence of tensors"). With it, the opaque is stored
    as plain attribute ``original{i}`` (out of the state dict and optimizer),
    the user's module is never written to, and the consistency check runs on
    the rebuilt value. Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    def __init__(
        self: Any, modules: Sequence[torch.nn.Module], original_value: torch.Tensor, unsafe: bool = False
    ) -> None:
        owner = subject(type(original_value))
        last = modules[0] if len(modules) else None
        found: dict[int, Any] = {}
        inverse = getattr(last, "right_inverse", None) if last is not None else None
        if inverse is None:
            original(self, modules, original_value, unsafe)
            return

        def right_inverse(value: Any) -> Any:
            result, opaques = _split(inverse(value), owner)
            if opaques:
                found.update(opaques)
                self.unsafe = True  # torch's check would see placeholders; ours runs below
            return result

        shape, dtype = original_value.shape, original_value.dtype
        # torch's __init__ gets a stand-in for the user's module, then the module takes its place
        assert last is not None  # inverse was read from it
        stand_in = _RightInverseStandIn(last, right_inverse)
        try:
            original(self, [stand_in, *modules[1:]], original_value, unsafe)
        finally:
            for key, module in list(self._modules.items()):
                if module is stand_in:
                    self._modules[key] = last
        if not found:
            return
        for i, opaque in found.items():
            name = f"original{i}"
            self._parameters.pop(name, None)
            self._buffers.pop(name, None)
            object.__setattr__(self, name, opaque)
        self.unsafe = unsafe
        if not unsafe:
            rebuilt = self()
            if not isinstance(rebuilt, torch.Tensor) or rebuilt.dtype != dtype or rebuilt.shape != shape:
                raise messages.rebuilt_differs(owner, rebuilt, shape, dtype)

    return __init__


def make_right_inverse(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``ParametrizationList.right_inverse`` (torch 2.11), which runs on
    assignment (``module.weight = new_value``).

    Without it, assigning when ``right_inverse`` returns a reference opaque
    fails. With it, opaque slots take the new objects and tensor slots update
    in place. Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """
    from torch.nn.utils.parametrize import _maybe_set

    def right_inverse(self: Any, value: Any) -> Any:  # what torch's returns
        slots = stored_opaque_leaves(self)
        if not slots:
            return original(self, value)
        owner = subject(type(value))
        with torch.no_grad():
            for module in reversed(self):
                if not hasattr(module, "right_inverse"):
                    raise messages.no_right_inverse(module)
                value = module.right_inverse(value)
            if not isinstance(value, Sequence) or len(value) != self.ntensors:
                raise messages.right_inverse_length(owner, self.ntensors, value)
            for i, item in enumerate(value):
                if i in slots:
                    if isinstance(item, torch.Tensor) or opaque_kind(item) != "reference":
                        if opaque_kind(item) == "value":
                            raise messages.value_opaque_returned(owner, i, item)
                        raise messages.unstorable_returned(owner, i, item)
                    object.__setattr__(self, f"original{i}", item)
                    continue
                stored = getattr(self, f"original{i}")
                if not isinstance(item, torch.Tensor) or item.dtype != stored.dtype:
                    raise messages.element_differs(owner, i, item, stored.dtype)
                _maybe_set(stored, item)

    return right_inverse


def _has_opaque(meta: Any) -> bool:
    """Whether torch's subclass-parametrization meta ``meta`` holds an opaque slot."""
    if isinstance(meta, OpaqueSlot):
        return True
    return meta is not None and any(_has_opaque(sub) for sub in meta.attrs.values())


def make_unwrap_right_inverse(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``UnwrapTensorSubclass.right_inverse`` of
    ``torch._functorch._aot_autograd.subclass_parametrization`` (torch 2.11).

    Without it, ``unwrap_tensor_subclass_parameters`` on a subclass parameter
    listing an opaque fails (``'Mesh' object has no attribute
    '__tensor_flatten__'``). With it, each reference opaque is one leaf (the
    very object) with an :class:`opaque_subclass.OpaqueSlot` in
    ``subclass_meta.attrs`` (torch 2.12+, pytorch/pytorch#176457: ``OpaqueMeta``);
    a value opaque (``ValueError``, as 2.12+) or unregistered object
    (``TypeError``) gets the library's error. Without opaques: torch's metadata.
    """
    from torch._functorch._aot_autograd.subclass_parametrization import SubclassCreationMeta as TorchMeta

    def torch_meta(meta: Layout) -> Any:
        """torch's metadata for the library's ``meta`` (``None`` for a plain tensor)."""
        if isinstance(meta, TensorSlot):
            return None
        if isinstance(meta, OpaqueSlot):
            return meta
        return TorchMeta(
            start_idx=meta.flat_tensor_start_idx,
            num_tensors=meta.arg_count,
            class_type=meta.subclass_type,
            attrs={name: torch_meta(sub) for name, sub in meta.attrs.items()},
            metadata=meta.meta,
            outer_size=meta.outer_size,
            outer_stride=meta.outer_stride,
        )

    def right_inverse(self: Any, tensor: torch.Tensor) -> list[Any]:
        if not is_wrapper_subclass(tensor):
            return original(self, tensor)  # type: ignore[no-any-return]  # torch's own check and error
        try:
            leaves, spec = flatten_subclass(tensor)
        except ValueOpaqueListedError as error:
            raise OpaqueValueError(str(error)) from None  # torch 2.12+'s exception type here
        assert isinstance(spec, SubclassLayout)  # a wrapper subclass was flattened
        if spec.num_opaques == 0:
            return original(self, tensor)  # type: ignore[no-any-return]  # tensors only: stock torch
        self.subclass_meta = torch_meta(spec)
        return leaves

    return right_inverse


def make_unwrap_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``UnwrapTensorSubclass.forward`` of
    ``torch._functorch._aot_autograd.subclass_parametrization`` (torch 2.11).

    Without it, the patched ``right_inverse``'s metadata cannot be read back
    (2.11 rebuilds every slot as a tensor or subclass). With it, each opaque
    leaf goes to ``__tensor_unflatten__`` as is, as torch 2.12+ does
    (pytorch/pytorch#176457); metadata without opaques runs torch's code.

    ``build`` is the one recursion outside :mod:`opaque_subclass.core.walk`: it
    reads torch-format ``self.subclass_meta`` (read by torch and user code,
    pickled with the module), not a subclass instance.
    """

    def build(meta: Any, leaves: tuple[Any, ...], at: int) -> tuple[Any, int]:
        if meta is None or isinstance(meta, OpaqueSlot):
            return leaves[at], at + 1
        inner: dict[str, Any] = {}
        for name, sub in meta.attrs.items():
            inner[name], at = build(sub, leaves, at)
        return meta.class_type.__tensor_unflatten__(inner, meta.metadata, meta.outer_size, meta.outer_stride), at

    def forward(self: Any, *leaves: Any) -> torch.Tensor:
        meta = self.subclass_meta
        if not _has_opaque(meta):
            return original(self, *leaves)  # type: ignore[no-any-return]  # a tensor
        return build(meta, leaves, 0)[0]  # type: ignore[no-any-return]  # a subclass instance

    return forward


_PL = "torch.nn.utils.parametrize.ParametrizationList."
_UT = "torch._functorch._aot_autograd.subclass_parametrization.UnwrapTensorSubclass."
