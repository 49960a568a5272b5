"""What a saved program holds in place of a subclass tensor with reference opaques.

:class:`StoredSubclass`, a wrapper tensor with the subclass's outer size,
stride, dtype and device, carries its structure (a tuple tree: class, context,
outer size and stride per level) and leaves, each reference opaque replaced by
its manifest *name*. ``torch.export.save`` pickles it like any subclass: the
archive holds data and contexts, never an opaque object.

The pickled form refers only to :func:`restore_stored` and the user's classes,
not the library's spec classes, so archives survive refactors. Format version 1:

* ``tree``: ``("subclass", cls, context, outer_size, outer_stride, ((attr, tree), ...))``,
  ``("tensor",)`` or ``("opaque", cls)``;
* ``leaves``: the flat leaves in slot order, ``None`` at opaque slots;
* ``names``: the manifest name of the opaque at each opaque slot (slot order).

Any operation on a ``StoredSubclass`` raises: it only exists between
``torch.export.load`` and :func:`opaque_subclass.export.load`'s rebinding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.flatten import unflatten_subclass
from opaque_subclass.core.spec import Layout, OpaqueSlot, SubclassLayout, TensorSlot, iter_slots
from opaque_subclass.export import messages

__all__ = ["FORMAT_VERSION", "StoredSubclass", "restore_stored", "spec_from_tree", "spec_tree"]

#: Version of the pickled payload of :class:`StoredSubclass`.
FORMAT_VERSION = 1

Tree = tuple[Any, ...]


def spec_tree(meta: Layout) -> Tree:
    """The library-independent tuple form of a flatten spec (no slot indices)."""
    if isinstance(meta, SubclassLayout):
        attrs = tuple((name, spec_tree(sub)) for name, sub in meta.attrs.items())
        return ("subclass", meta.subclass_type, meta.meta, tuple(meta.outer_size), tuple(meta.outer_stride), attrs)
    if isinstance(meta, OpaqueSlot):
        return ("opaque", meta.opaque_type)
    return ("tensor",)


def spec_from_tree(tree: Tree, start: int = 0, attr: str | None = None) -> Layout:
    """Rebuild the spec that :func:`spec_tree` describes, slots numbered from ``start``."""
    match tree[0]:
        case "subclass":
            _, cls, context, size, stride, attrs = tree
            metas: dict[str, Layout] = {}
            idx = start
            for name, sub in attrs:
                meta = spec_from_tree(sub, idx, name)
                metas[name] = meta
                idx += meta.arg_count if isinstance(meta, SubclassLayout) else 1
            return SubclassLayout(
                flat_tensor_start_idx=start,
                attrs=metas,
                meta=context,
                outer_size=tuple(size),
                outer_stride=tuple(stride),
                subclass_type=cls,
                attr=attr,
            )
        case "opaque":
            return OpaqueSlot(start, attr, tree[1])
        case "tensor":
            return TensorSlot(start, attr)
        case _:
            raise messages.tree_node_unknown(tree[0])


class StoredSubclass(torch.Tensor):
    """Placeholder for a subclass tensor with reference opaques inside a saved program,
    made by :func:`restore_stored` only.

    Attributes
    ----------
    _tree, _leaves, _names
        The payload described in the module docstring.
    _path
        The name of the tensor in the program (``"w"``), for messages.
    """

    _tree: Tree
    _leaves: tuple[Any, ...]
    _names: tuple[str, ...]
    _path: str

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # torch's idiom; the stub types the unbound C function

    def __repr__(self) -> str:  # type: ignore[override]  # data-free on purpose
        return f"StoredSubclass({self._path!r}, {qualified_name(self.subclass_type)}, shape={tuple(self.shape)})"

    @property
    def subclass_type(self) -> type:
        """The subclass this placeholder stands for."""
        return self._tree[1]  # type: ignore[no-any-return]  # a class, by the format

    def copy_like(self, requires_grad: bool) -> StoredSubclass:
        return restore_stored(*self._state(requires_grad, is_param=False))  # type: ignore[return-value]  # not a parameter

    def _state(self, requires_grad: bool, *, is_param: bool) -> tuple[Any, ...]:
        """The arguments of :func:`restore_stored` that rebuild this placeholder."""
        return (
            FORMAT_VERSION,
            self._tree,
            self._leaves,
            self._names,
            self._path,
            tuple(self.shape),
            tuple(self.stride()),
            self.dtype,
            str(self.device),
            requires_grad,
            is_param,
        )

    def rebuild(self, objects: Mapping[str, Any]) -> torch.Tensor:
        """The subclass, each opaque slot bound to ``objects[name]`` (leaves checked;
        a parameter placeholder gives a ``torch.nn.Parameter``)."""
        spec = spec_from_tree(self._tree)
        names = iter(self._names)
        leaves = [objects[next(names)] if leaf is None else leaf for leaf in self._leaves]
        result = unflatten_subclass(leaves, spec, name=self._path)
        if isinstance(self, torch.nn.Parameter):
            return torch.nn.Parameter(result, requires_grad=self.requires_grad)
        return result  # type: ignore[no-any-return]  # a tensor subclass instance

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (restore_stored, self._state(self.requires_grad, is_param=isinstance(self, torch.nn.Parameter)))

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # Tensor declares its disabled default as a plain function
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        if func is torch.ops.aten.detach.default:  # nn.Parameter(placeholder) detaches
            return args[0].copy_like(requires_grad=False)
        stored = next(a for a in args if isinstance(a, StoredSubclass))
        slots = iter_slots(spec_from_tree(stored._tree))
        types = [slot.opaque_type for _, slot in slots if isinstance(slot, OpaqueSlot)]
        raise messages.placeholder_used(func, stored.subclass_type, stored._path, stored._names, types)


def restore_stored(
    version: int,
    tree: Tree,
    leaves: Sequence[Any],
    names: Sequence[str],
    path: str,
    size: Sequence[int],
    stride: Sequence[int],
    dtype: torch.dtype,
    device: str,
    requires_grad: bool,
    is_param: bool,
) -> torch.Tensor:
    """Unpickle (or make) a :class:`StoredSubclass` with the size, stride, dtype, device and
    ``requires_grad`` of the subclass instance it stands for (a parameter's as a ``torch.nn.Parameter``)."""
    if version > FORMAT_VERSION:
        raise messages.stored_format_newer(path, version, FORMAT_VERSION)
    stored: StoredSubclass = torch.Tensor._make_wrapper_subclass(
        StoredSubclass,
        tuple(size),
        strides=tuple(stride),
        dtype=dtype,
        device=torch.device(device),
        requires_grad=requires_grad and not is_param,
    )
    stored._tree, stored._leaves, stored._names, stored._path = tree, tuple(leaves), tuple(names), path
    return torch.nn.Parameter(stored, requires_grad=requires_grad) if is_param else stored
