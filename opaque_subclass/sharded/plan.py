"""Sharding an existing module's parameters by a plan: :func:`shard_module`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from torch import nn

from opaque_subclass.core.checks import require_module
from opaque_subclass.sharded import messages
from opaque_subclass.sharded.tensor import ShardedTensor

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["shard_module"]


def shard_module(module: nn.Module, mesh: DeviceMesh, plan: Mapping[str, int | None]) -> nn.Module:
    """Replace the parameters named in ``plan`` by ``nn.Parameter(ShardedTensor)``, in place.

    ``plan`` maps each to its shard dim (``None``: replicated); its current value
    (plain, or sharded on another mesh) must be equal on every rank. Returns ``module``.
    """
    require_module(module, "opaque_subclass.sharded.shard_module")
    names = dict(module.named_parameters())
    missing = sorted(set(plan) - set(names))
    if missing:
        raise messages.plan_names_missing(missing, module)
    for name, dim in plan.items():
        value = names[name].detach()
        full = value.full_tensor() if isinstance(value, ShardedTensor) else value
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        setattr(owner, attr, nn.Parameter(ShardedTensor.from_full(full, mesh, dim)))
    return module
