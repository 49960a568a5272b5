"""The reference sharded tensor: :class:`ShardedTensor` (a local shard, its
``DeviceMesh`` as a reference opaque, a shard dim), its collectives (custom ops
that take the mesh and resolve its process group when they run), and
:func:`shard_module`, which shards an existing module's parameters by a plan.
The demo of ``python -m opaque_subclass`` lives with the CLI
(:mod:`opaque_subclass.cli.demo`).

Importing this package defines no collective op: the first ``ShardedTensor``
collective, or the first access to an op here, does.
"""

from __future__ import annotations

from opaque_subclass.sharded import collectives as _collectives
from opaque_subclass.sharded.collectives import CollectiveRecord, define_ops, record_collectives
from opaque_subclass.sharded.plan import shard_module
from opaque_subclass.sharded.tensor import ShardedTensor

__all__ = [
    "CollectiveRecord",
    "ShardedTensor",
    "all_gather",
    "all_reduce_sum",
    "define_ops",
    "local_chunk",
    "record_collectives",
    "shard_module",
]


# The collective ops are defined on first access (PEP 562), in collectives.
__getattr__ = _collectives.reexporting(__name__)
