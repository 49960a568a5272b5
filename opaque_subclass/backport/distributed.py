"""FSDP module-state synchronisation and memory tools with opaque attributes
(torch 2.11).

FSDP1's ``sync_module_states=True`` broadcasts every parameter and buffer from
rank 0, reading a subclass's inner tensors from its ``__tensor_flatten__``
names; ``torch.distributed._tools`` counts memory by the storages behind those
names. torch 2.11 treats an opaque attribute as a tensor in both places;
torch 2.12 (pytorch/pytorch#176457) skips opaques: they are not data to
broadcast and hold no memory of the tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.backport.hiding import tensor_leaves
from opaque_subclass.core.flatten import is_wrapper_subclass

__all__ = ["make_get_untyped_storages", "make_sync_module_states"]


def make_sync_module_states(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.distributed.fsdp._init_utils._sync_module_params_and_buffers``
    (torch 2.11).

    Without it, ``sync_module_states=True`` on a module whose parameters or
    buffers are subclasses listing an opaque tries to broadcast the opaque and
    fails. With it, the inner tensors are broadcast from rank 0 and every
    opaque stays the object each rank already has; nested subclasses are
    walked (torch reads one level). Unnecessary since torch 2.12
    (pytorch/pytorch#176457).
    """
    from torch.distributed.fsdp import _init_utils

    def _sync_module_params_and_buffers(module: torch.nn.Module, params: list[Any], process_group: Any) -> None:
        states: list[torch.Tensor] = []
        for buffer in module.buffers():
            if getattr(buffer, _init_utils.FSDP_SYNCED, False):
                continue
            setattr(buffer, _init_utils.FSDP_SYNCED, True)
            states.extend(tensor_leaves(buffer.detach()))
        for param in params:
            states.extend(tensor_leaves(param.detach()))
        _init_utils._check_module_states_for_sync_module_states(states)
        _init_utils._sync_params_and_buffers(  # type: ignore[attr-defined]  # imported there; looked up there, as the original does
            process_group, states, _init_utils.PARAM_BROADCAST_BUCKET_SIZE, src=0
        )

    return _sync_module_params_and_buffers


def make_get_untyped_storages(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.distributed._tools.common_utils.get_untyped_storages``
    (torch 2.11), used by ``MemTracker`` and the SAC estimator.

    Without it, tracking memory of a subclass listing an opaque treats the
    opaque as a tensor (it has no ``untyped_storage``; torch warns and the
    walk breaks). With it, the storages of the tensor leaves are collected and
    opaques are left out. Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    def get_untyped_storages(t: torch.Tensor) -> set[torch.UntypedStorage]:
        if not is_wrapper_subclass(t):
            return original(t)  # type: ignore[no-any-return]  # torch's own result
        storages: set[torch.UntypedStorage] = set()
        for leaf in tensor_leaves(t):
            storages |= original(leaf)
        return storages

    return get_untyped_storages
