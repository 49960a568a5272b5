"""DTensor code compiles and runs the same with ``DeviceMesh`` registered as a
reference opaque (gloo, world size 1, 127.0.0.1), on every leg.

On torch 2.11 the backport makes a registered mesh a graph input; a DTensor's
own mesh (kept in its flatten context) must stay the compile-time constant
DTensor's code needs: before the fix, ``x.redistribute(x.device_mesh, ...)``
and ``DTensor.from_local(..., x.device_mesh, ...)`` failed with
"TorchScriptObjectVariable(FakeScriptObject) is self-referential".
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from subclasses import registered_mesh_world_of_one

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this build")


@pytest.fixture(scope="module")
def mesh():
    with registered_mesh_world_of_one() as device_mesh:
        yield device_mesh


def _redistribute_and_rebuild(x):
    from torch.distributed.tensor import DTensor, Replicate

    y = x.redistribute(x.device_mesh, [Replicate()])
    return DTensor.from_local(y.to_local() * 2, x.device_mesh, [Replicate()]).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dtensor_forward_backward_redistribute_from_local(mesh, backend):
    from torch.distributed.tensor import Shard, distribute_tensor

    torch._dynamo.reset()
    f = torch.compile(_redistribute_and_rebuild, backend=backend, fullgraph=True)
    x = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]).requires_grad_(True)
    out = f(x)
    out.backward()
    ref_x = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]).requires_grad_(True)
    ref = _redistribute_and_rebuild(ref_x)
    ref.backward()
    torch._dynamo.reset()
    assert torch.equal(out.full_tensor(), ref.full_tensor())
    assert torch.equal(x.grad.full_tensor(), ref_x.grad.full_tensor())
    assert x.grad.device_mesh is mesh


def test_dtensor_to_local_and_mesh_as_argument(mesh):
    """A mesh passed as an argument next to a DTensor: both uses compile."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    def g(x, m):
        return DTensor.from_local(x.to_local() + 1, x.device_mesh, [Replicate()]), m

    torch._dynamo.reset()
    f = torch.compile(g, backend="aot_eager", fullgraph=True)
    x = distribute_tensor(torch.ones(2), mesh, [Shard(0)])
    out, got = f(x, mesh)
    torch._dynamo.reset()
    assert got is mesh and torch.equal(out.to_local(), torch.full((2,), 2.0))
