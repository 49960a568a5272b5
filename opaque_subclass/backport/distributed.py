"""FSDP module-state synchronisation and memory tools with opaque attributes
(torch 2.11).

FSDP1's ``sync_module_states=True`` broadcasts, and ``torch.distributed._tools``
counts the storages of, a subclass's flattened attributes; torch 2.11 treats an
opaque as a tensor in both, torch 2.12 (pytorch/pytorch#176457) skips it.
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

    Without it, ``sync_module_states=True`` with subclass parameters or buffers
    listing an opaque fails broadcasting it. With it, the inner tensors (nesting
    walked) are broadcast from rank 0 and each rank keeps its opaques.
    Unnecessary since torch 2.12 (pytorch/pytorch#176457).
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

    Without it, the opaque is treated as a tensor (no ``untyped_storage``: torch
    warns, the walk breaks). With it, only the tensor leaves' storages count.
    Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    def get_untyped_storages(t: torch.Tensor) -> set[torch.UntypedStorage]:
        if not is_wrapper_subclass(t):
            return original(t)  # type: ignore[no-any-return]  # torch's own result
        storages: set[torch.UntypedStorage] = set()
        for leaf in tensor_leaves(t):
            storages |= original(leaf)
        return storages

    return get_untyped_storages
