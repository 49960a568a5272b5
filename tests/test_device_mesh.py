"""A real torch.distributed DeviceMesh (gloo, world size 1, 127.0.0.1) as an
opaque attribute, on torch 2.11 (where DeviceMesh does not inherit OpaqueBase)
and on torch 2.13."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from subclasses import MeshTensor, nested
from torch._library import opaque_object
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import opaque_subclass as osc
from opaque_subclass.releases import current


@pytest.fixture(scope="module")
def mesh():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    dist.init_process_group(
        "gloo",
        store=dist.HashStore(),
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
    )
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_device_mesh_is_registrable(mesh):
    osc.register_opaque(DeviceMesh)
    osc.register_opaque(DeviceMesh)  # twice: a no-op, also where torch registered it first
    assert osc.opaque_kind(mesh) == "reference"
    # torch's own entry, in the running release's names ("symbolic" on torch >= 2.14)
    assert opaque_object._OPAQUE_TYPES[DeviceMesh].opaque_typ == current().registry.kinds["reference"]


def test_device_mesh_registered_by_torch_is_accepted_as_is(mesh):
    # torch >= 2.12 registers DeviceMesh itself once torch.distributed.tensor is
    # imported (torch 2.14 under its new name, "symbolic"); ours is then a no-op
    # that keeps torch's entry, and the kind reads "reference" on every release.
    import torch.distributed.tensor  # noqa: F401  - runs torch's own registration where it has one

    entry = opaque_object._OPAQUE_TYPES.get(DeviceMesh)
    osc.register_opaque(DeviceMesh, kind="reference")
    osc.register_opaque(DeviceMesh, kind="symbolic")
    assert entry is None or opaque_object._OPAQUE_TYPES[DeviceMesh] is entry
    assert osc.opaque_kind(DeviceMesh) == "reference"
    with pytest.raises(ValueError, match="already registered as a reference opaque"):
        osc.register_opaque(DeviceMesh, kind="constant")


def test_device_mesh_round_trip(mesh):
    osc.register_opaque(DeviceMesh)
    x = MeshTensor(torch.randn(4), mesh)
    leaves, spec = osc.flatten_subclass(x)
    assert leaves[1] is mesh and spec.attrs["_mesh"].opaque_type is type(mesh)
    y = osc.unflatten_subclass(leaves, spec)
    assert y._mesh is mesh and y._mesh.get_group() is mesh.get_group()


def test_device_mesh_runtime_and_sharing(mesh):
    osc.register_opaque(DeviceMesh)
    other = DeviceMesh("cpu", torch.arange(1))
    args = [MeshTensor(torch.randn(2), mesh), nested(1, data=torch.randn(2)), MeshTensor(torch.randn(2), mesh), other]
    args[1]._mesh = other
    metas = osc.describe_args(args)
    flat = osc.unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
    pattern = osc.opaque_alias_pattern(flat)
    assert pattern.groups == ((1, 5), (3, 6))
    rt = [m.runtime_safe() if isinstance(m, osc.SubclassLayout) else m for m in metas]
    out = osc.wrap_args(flat, subclass_metas=rt, is_runtime=True)
    assert out[0]._mesh is mesh and out[1]._mesh is other and out[3] is other
    t = torch.ones(2)
    dist.all_reduce(t, group=out[0]._mesh.get_group())
    assert torch.equal(t, torch.ones(2))


def test_registering_device_mesh_first_keeps_dtensor_working():
    # torch >= 2.12 registers DeviceMesh itself when torch.distributed.tensor is
    # imported and must not find a conflicting registration.
    import subprocess
    import sys

    code = (
        "import torch, opaque_subclass\n"
        "from torch.distributed.device_mesh import DeviceMesh\n"
        "opaque_subclass.register_opaque(DeviceMesh)\n"
        "import torch.distributed.tensor\n"
        "assert opaque_subclass.opaque_kind(DeviceMesh) == 'reference'\n"
        "print('OK')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OK" in out.stdout
