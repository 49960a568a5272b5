"""Compile once per job? Simulated jobs of up to 8192 ranks, on one machine.

For each world size and mesh (1-D: ``(W,)``; 2-D: ``(W // 8, 8)`` named
``("dp", "tp")``), :func:`opaque_subclass.testing.simulate_job` runs a
tensor-parallel MLP training step (forward and backward under
``torch.compile(backend="inductor")``, then an eager gradient all-reduce over
``dp`` and an SGD update, two steps) in one fresh process per sampled rank
(4 ranks spread over the mesh, no two in one dp or tp group), joined to torch's
fake process group, all sharing one ``TORCHINDUCTOR_CACHE_DIR``; the same step
with a loss that gathers the hidden activation with ``ShardedTensor.redistribute``
inside the compiled function (``sharded-redistribute``); then the same
model with torch's ``DTensor`` (``parallelize_module`` with
``ColwiseParallel`` / ``RowwiseParallel``), as torch compiles it and under
:func:`opaque_subclass.dtensor.share_compiles` (``dtensor-shared``); and a vendor subclass
adopted with :func:`opaque_subclass.adopt`, whose dispatch all-reduces over its mesh's group, as
torch compiles it (``adopted``: the ranks of a tp group share an entry) and under
``share_compiles`` (``adopted-shared``: one entry for the job). It prints, per job, the
compilations, AOTAutograd cache hits/misses/bypasses, FX graph cache misses and
summed compile seconds, and, for the library's step and DTensor under ``share_compiles``, whether every rank's
compiled collectives ran on that rank's own tensor-parallel group.

"1 miss per job" is the goal: the first rank compiles, every other rank loads
the artifact. Usage::

    python benchmarks/bench_job_compile.py [--world 64 8192] [--meshes 1d 2d]
                                           [--models sharded sharded-redistribute dtensor dtensor-shared
                                                     adopted adopted-shared]
                                           [--ranks 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))


def _model(tp: int) -> Any:
    import torch.nn as nn

    hidden = 4 * tp  # every rank holds 4 rows of the first layer, 4 columns of the second
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 8))


def _tp_dp(mesh: Any) -> tuple[Any, Any]:
    if mesh.ndim == 1:
        return mesh, None
    return mesh["tp"], mesh["dp"]


def train(
    model: Any, mesh: Any, steps: int, local_grads: Any, compiled: bool = True, penalty: bool = False
) -> list[float]:
    """``steps`` SGD steps (the same data on every rank); returns the losses.
    The forward and backward are compiled; the data-parallel gradient
    all-reduce runs eagerly after backward, as DDP and FSDP run it. With
    ``penalty``, the loss adds an L2 penalty on the whole hidden activation,
    which the step gathers from its shards with ``redistribute(None)`` (an
    all-gather over tp) inside the compiled function."""
    import torch
    import torch.distributed as dist

    _, dp = _tp_dp(mesh)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not penalty:
            return ((model(x) - y) ** 2).mean()
        hidden = model[1](model[0](x))  # sharded over tp along its features (column-parallel layer)
        gathered = hidden.redistribute(None)
        return ((model[2](hidden) - y) ** 2).mean() + 1e-3 * (gathered**2).mean()

    step = torch.compile(loss_fn, backend="inductor") if compiled else loss_fn
    losses = []
    for i in range(steps):
        data = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 16, generator=data), torch.randn(4, 8, generator=data)
        loss = step(x, y)
        loss.backward()
        losses.append(float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()))
        with torch.no_grad():
            for p in model.parameters():
                if dp is not None:  # data parallel: sum the gradients over dp, as DDP / FSDP do
                    dist.all_reduce(local_grads(p.grad), group=dp.get_group())
                p.sub_(p.grad, alpha=0.01)
                p.grad = None
    return losses


PLAN = {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None}  # column-, then row-parallel


def sharded_model(mesh: Any) -> Any:
    """The MLP with ``ShardedTensor`` weights over the mesh's tp dimension (the same weights on every rank)."""
    import torch

    from opaque_subclass.sharded import shard_module

    tp, _ = _tp_dp(mesh)
    torch.manual_seed(0)
    return shard_module(_model(tp.size()), tp, PLAN)


def sharded_step(mesh: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """The library's ``ShardedTensor``: weights sharded over the tp mesh, whose
    collectives are custom ops taking the mesh as a graph input."""
    from opaque_subclass.sharded import record_collectives

    tp, _ = _tp_dp(mesh)
    with record_collectives() as seen:
        losses = train(sharded_model(mesh), mesh, payload.get("steps", 2), lambda g: g.local_tensor())
    own = str(tp.get_group().group_name)
    return {"own_tp_group": own, "collective_groups": sorted({r.group_name for r in seen}), "losses": losses}


def sharded_redistribute_step(mesh: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """The same ``ShardedTensor`` model with a loss that calls ``redistribute`` in the
    compiled step (torch 2.11's Dynamo took any method of that name for DTensor's)."""
    from opaque_subclass.sharded import record_collectives

    tp, _ = _tp_dp(mesh)
    with record_collectives() as seen:
        losses = train(sharded_model(mesh), mesh, payload.get("steps", 2), lambda g: g.local_tensor(), penalty=True)
    own = str(tp.get_group().group_name)
    return {"own_tp_group": own, "collective_groups": sorted({r.group_name for r in seen}), "losses": losses}


def dtensor_step(mesh: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """torch's ``DTensor`` tensor parallelism on the same model."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp, _ = _tp_dp(mesh)
    torch.manual_seed(0)
    model = parallelize_module(_model(tp.size()), tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    train(model, mesh, payload.get("steps", 2), lambda g: g.to_local())
    return {}


def dtensor_shared_step(mesh: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """The same DTensor model compiled under :func:`opaque_subclass.dtensor.share_compiles`:
    its collectives take their group from the mesh input when they run."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from opaque_subclass.dtensor import share_compiles
    from opaque_subclass.sharded import record_collectives

    tp, _ = _tp_dp(mesh)
    torch.manual_seed(0)
    model = parallelize_module(_model(tp.size()), tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    with share_compiles(), record_collectives() as seen:
        losses = train(model, mesh, payload.get("steps", 2), lambda g: g.to_local())
    own = str(tp.get_group().group_name)
    return {"own_tp_group": own, "collective_groups": sorted({r.group_name for r in seen}), "losses": losses}


class _Spec:
    """A vendor spec: the mesh and the placements (compared by value, as DTensor's specs are)."""

    def __init__(self, mesh: Any, placements: tuple[str, ...]) -> None:
        self.mesh, self.placements = mesh, placements

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Spec) and (self.mesh, self.placements) == (other.mesh, other.placements)

    def __hash__(self) -> int:
        return hash(self.placements)


class VendorShard(torch.Tensor):
    """A sharded subclass of another package, as PhysicsNeMo's ``ShardTensor`` is written: the
    mesh in a spec in the flatten context, outputs built as the class itself, and every op's
    result all-reduced over the mesh's group in ``__torch_dispatch__`` (a partial-sum
    redistribution, issued while AOTAutograd traces)."""

    @staticmethod
    def __new__(cls, local: Any, spec: _Spec, *, requires_grad: bool = False) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, local.shape, dtype=local.dtype, requires_grad=requires_grad)

    def __init__(self, local: Any, spec: _Spec, *, requires_grad: bool = False) -> None:
        self._local_tensor, self._spec = local, spec

    def __repr__(self) -> str:
        return f"VendorShard(placements={self._spec.placements})"

    def __tensor_flatten__(self) -> Any:
        return ["_local_tensor"], (self._spec, self.requires_grad)

    @classmethod
    def __tensor_unflatten__(cls, inner: Any, ctx: Any, size: Any, stride: Any) -> Any:
        return cls(inner["_local_tensor"], ctx[0], requires_grad=ctx[1])

    @classmethod
    def __metadata_guard__(cls, orig: Any, other: Any) -> bool:
        return bool(orig == other)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import torch.distributed._functional_collectives as funcol
        from torch.utils._pytree import tree_map_only

        spec = next(a._spec for a in args if isinstance(a, VendorShard))
        out = func(*tree_map_only(VendorShard, lambda t: t._local_tensor, args), **(kwargs or {}))
        group = spec.mesh.get_group()
        out = tree_map_only(torch.Tensor, lambda t: funcol.all_reduce(t, "sum", group), out)
        return tree_map_only(torch.Tensor, lambda t: VendorShard(t, spec), out)


def _adopted_run(mesh: Any, payload: dict[str, Any], shared: bool) -> dict[str, Any]:
    import contextlib

    import torch
    from torch.distributed.device_mesh import DeviceMesh

    import opaque_subclass
    from opaque_subclass.dtensor import share_compiles
    from opaque_subclass.sharded import record_collectives

    tp, _ = _tp_dp(mesh)
    cls = VendorShard
    adoption = opaque_subclass.adopt(cls, {"_mesh": opaque_subclass.ContextOpaque("[0].mesh", DeviceMesh)})
    try:
        step = torch.compile(lambda t: (t * 2 + 1)._local_tensor, backend="inductor")
        values = []
        with share_compiles() if shared else contextlib.nullcontext(), record_collectives() as seen:
            for _ in range(payload.get("steps", 2)):
                values.append(step(cls(torch.ones(4), _Spec(tp, ("partial",)))).tolist())
    finally:
        adoption.undo()
    own = str(tp.get_group().group_name)
    return {"own_tp_group": own, "collective_groups": sorted({r.group_name for r in seen}), "values": values}


def adopted_step(mesh: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A vendor subclass adopted (its spec's mesh an opaque attribute), whose dispatch
    all-reduces over the mesh's tp group: the graph names this rank's group, so the
    ranks of one tp group share a cache entry and no other rank is served it."""
    return _adopted_run(mesh, payload, shared=False)


def adopted_shared_step(mesh: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """The same, compiled under :func:`opaque_subclass.dtensor.share_compiles`: the
    all-reduce takes its group from the mesh input, one entry serves the job."""
    return _adopted_run(mesh, payload, shared=True)


STEPS = {
    "sharded": "sharded_step",
    "sharded-redistribute": "sharded_redistribute_step",
    "dtensor": "dtensor_step",
    "dtensor-shared": "dtensor_shared_step",
    "adopted": "adopted_step",
    "adopted-shared": "adopted_shared_step",
}

#: Why a model cannot compile once per job on a release, printed with its figures.
LIMITS = {
    ((2, 11), "dtensor-shared"): (
        "torch 2.11's Dynamo puts DTensor's from_local / redistribute / to_local in the graph as "
        "closures over the mesh and placements, which its AOTAutograd cache cannot key (bypass on "
        "every rank); torch 2.12+ calls them by name. The collectives still run on each rank's own group."
    ),
}


def _mesh(world: int, kind: str) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    if kind == "1d":
        return (world,), ("tp",)
    return (world // 8, 8), ("dp", "tp")


def main(argv: list[str] | None = None) -> int:
    from opaque_subclass.releases import parse_release
    from opaque_subclass.testing import simulate_job, spread_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, nargs="+", default=[64, 8192])
    parser.add_argument("--meshes", nargs="+", default=["1d", "2d"], choices=["1d", "2d"])
    parser.add_argument("--models", nargs="+", default=list(STEPS), choices=sorted(STEPS))
    parser.add_argument("--ranks", type=int, default=4, help="sampled ranks per job")
    parser.add_argument("--json", help="write the reports here")
    args = parser.parse_args(argv)

    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    rows: list[dict[str, Any]] = []
    for world in args.world:
        for kind in args.meshes:
            shape, names = _mesh(world, kind)
            ranks = spread_ranks(shape, args.ranks)
            for model in args.models:
                started = time.monotonic()
                report = simulate_job(f"{HERE}:{STEPS[model]}", world, shape, names, ranks=ranks)
                own_group = all(
                    r.value.get("collective_groups") == [r.value.get("own_tp_group")]
                    for r in report.ranks
                    if "own_tp_group" in r.value
                )
                print(f"\n[{model} {kind}] {report.table()}")
                if model not in ("dtensor", "adopted"):  # torch's own collectives are not recorded
                    print(f"  every rank's collectives ran on its own tp group: {own_group}")
                limit = LIMITS.get((parse_release(torch.__version__), model))
                if limit:
                    print(f"  torch limit: {limit}")
                print(f"  ({time.monotonic() - started:.0f} s wall)")
                rows.append(
                    {
                        "torch": torch.__version__,
                        "model": model,
                        "mesh": kind,
                        "world": world,
                        "ranks": [r.rank for r in report.ranks],
                        "aot_hits": report.aot_hits,
                        "aot_misses": report.aot_misses,
                        "aot_bypasses": report.aot_bypasses,
                        "fx_misses": report.fx_misses,
                        "compilations": report.compilations,
                        "compile_seconds": round(report.compile_seconds, 2),
                        "own_group": own_group if model not in ("dtensor", "adopted") else None,
                        "bypass_reasons": sorted({x for r in report.ranks for x in r.bypass_reasons}),
                    }
                )
    print("\n| model | mesh | W | sampled ranks | AOT hit/miss/bypass | FX misses | compile s (sum) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['model']} | {row['mesh']} | {row['world']} | {len(row['ranks'])} | "
            f"{row['aot_hits']}/{row['aot_misses']}/{row['aot_bypasses']} | {row['fx_misses']} | {row['compile_seconds']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
