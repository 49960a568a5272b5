"""Subclass parameters as parametrizations over plain tensor leaves.

:func:`unwrap_tensor_subclass_parameters` turns every parameter and buffer of
a module that is a wrapper subclass (opaque attributes and nesting included)
into a parametrization: the module stores the subclass's *leaves* - its plain
tensors as parameters/buffers, its opaques as plain attributes - and
``module.weight`` rebuilds the subclass on access. Exporters and optimizers
then see only plain tensors; the state dict holds only tensors; the opaques
keep their identity.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import parametrize

from .codegen import compiled_wrap
from .flatten import flatten_subclass, is_wrapper_subclass
from .schema import SubclassCreationMeta

__all__ = ["UnwrapSubclass", "unwrap_tensor_subclass_parameters"]


class UnwrapSubclass(torch.nn.Module):
    """The parametrization: ``right_inverse`` flattens, ``forward`` rebuilds.

    ``right_inverse(x)`` returns the leaves of ``x`` (tensors and reference
    opaques, in flat-slot order) and remembers its structure; ``forward(*leaves)``
    rebuilds the subclass with a generated straight-line function.
    """

    spec: SubclassCreationMeta | None

    def __init__(self) -> None:
        super().__init__()
        self.spec = None
        self._rebuild: Any = None

    def forward(self, *leaves: Any) -> torch.Tensor:
        if self._rebuild is None:
            raise RuntimeError(
                "UnwrapSubclass.forward called before right_inverse; register it with "
                "torch.nn.utils.parametrize.register_parametrization(module, name, UnwrapSubclass(), unsafe=True)."
            )
        return self._rebuild(leaves)  # type: ignore[no-any-return]  # a subclass instance

    def right_inverse(self, value: torch.Tensor) -> list[Any]:
        leaves, spec = flatten_subclass(value)
        if not isinstance(spec, SubclassCreationMeta):
            raise TypeError(
                f"UnwrapSubclass expects a wrapper subclass, got {type(value).__qualname__}. Fix: "
                "parametrize only subclass parameters (unwrap_tensor_subclass_parameters does)."
            )
        safe = spec.runtime_safe()
        self.spec = safe
        self._rebuild = compiled_wrap(safe)
        return leaves


def unwrap_tensor_subclass_parameters(module: torch.nn.Module) -> torch.nn.Module:
    """Parametrize every wrapper-subclass parameter and buffer of ``module`` and
    its submodules over its plain leaves. Returns ``module`` (changed in place).

    After the call, for a parameter ``w`` that was a subclass:

    * ``module.w`` returns the subclass, holding the very same opaque objects;
    * ``module.parametrizations.w.original{i}`` are the tensor leaves
      (parameters whose ``requires_grad`` follows ``w``, or buffers) and the
      opaque leaves (plain attributes);
    * ``module.state_dict()`` holds only tensors.

    Works on torch 2.11 (with the backport) and on torch >= 2.12.
    """
    for sub in module.modules():
        names = [n for n, p in sub.named_parameters(recurse=False) if is_wrapper_subclass(p)]
        names += [n for n, b in sub.named_buffers(recurse=False) if is_wrapper_subclass(b)]
        for name in names:
            if parametrize.is_parametrized(sub, name):
                continue
            parametrize.register_parametrization(sub, name, UnwrapSubclass(), unsafe=True)
    return module
