"""What ``opaque_subclass.export.save``/``load`` cost next to torch's own save/load.

One model, three forms, exported once each (not timed), then saved to and
loaded from memory ``--repeats`` times (best time kept):

* ``plain``: ``--layers`` plain ``nn.Parameter`` weights; ``torch.export.save``/``load``.
  The reference: ratios are against it.
* ``subclass``: the same weights as ``Sharded`` subclass parameters sharing one
  reference opaque; ``opaque_subclass.export.save``/``load`` (each parameter is
  stored as a placeholder and rebuilt at load).
* ``unwrapped``: the subclass model after ``unwrap_subclass_parameters``;
  ``opaque_subclass.export.save``/``load`` (each construction in the graph is
  stored as the library op and restored at load).
* ``torch-subclass`` (native torch only): the ``subclass`` program through
  ``torch.export.save``/``load``, which pickle the opaque by value: what the
  library replaces. (torch 2.11's backport refuses that save.)

Also prints the archive sizes. Usage::

    python benchmarks/bench_export.py [--layers 16] [--size 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable

import torch

import opaque_subclass
import opaque_subclass.export as oexport
from opaque_subclass import OpaqueBase, OpaqueSubclass, unwrap_subclass_parameters


class Mesh(OpaqueBase):
    def __init__(self, name: str) -> None:
        self.name = name


opaque_subclass.register_opaque(Mesh)


class Sharded(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}


class Stack(torch.nn.Module):
    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(w) for w in weights])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = x * w
        return x


def _best(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    data = [torch.randn(args.size, args.size) for _ in range(args.layers)]
    x = torch.randn(args.size, args.size)
    mesh = Mesh("bench")
    subclass_model = Stack([Sharded(d, mesh) for d in data])
    programs = {
        "plain": torch.export.export(Stack(data), (x,), strict=False),
        "subclass": torch.export.export(subclass_model, (x,), strict=False),
        "unwrapped": torch.export.export(
            unwrap_subclass_parameters(Stack([Sharded(d, mesh) for d in data])), (x,), strict=False
        ),
    }
    native = opaque_subclass.support().mode == "native"

    def torch_round_trip(ep: torch.export.ExportedProgram) -> tuple[Callable[[], object], Callable[[], object], int]:
        buf = io.BytesIO()
        torch.export.save(ep, buf)
        blob = buf.getvalue()
        return (lambda: torch.export.save(ep, io.BytesIO())), (lambda: torch.export.load(io.BytesIO(blob))), len(blob)

    def ours_round_trip(ep: torch.export.ExportedProgram) -> tuple[Callable[[], object], Callable[[], object], int]:
        buf = io.BytesIO()
        oexport.save(ep, buf)
        blob = buf.getvalue()
        loader = Mesh("loader")
        return (
            (lambda: oexport.save(ep, io.BytesIO())),
            (lambda: oexport.load(io.BytesIO(blob), opaques=lambda name, cls: loader)),
            len(blob),
        )

    rows = {"plain": torch_round_trip(programs["plain"])}
    rows["subclass"] = ours_round_trip(programs["subclass"])
    rows["unwrapped"] = ours_round_trip(programs["unwrapped"])
    if native:
        rows["torch-subclass"] = torch_round_trip(programs["subclass"])

    # the loaded programs compute what the originals do
    for name in ("subclass", "unwrapped"):
        loaded = rows[name][1]()
        out = loaded.module()(x)  # type: ignore[attr-defined]  # an ExportedProgram
        torch.testing.assert_close(out._data, subclass_model(x)._data)

    print(
        f"torch {torch.__version__} ({opaque_subclass.support().mode}); {args.layers} weights of "
        f"{args.size}x{args.size} float32; best of {args.repeats}"
    )
    print(f"{'form':<15} {'save ms':>9} {'x plain':>8} {'load ms':>9} {'x plain':>8} {'archive KiB':>12}")
    base_save = _best(rows["plain"][0], args.repeats)
    base_load = _best(rows["plain"][1], args.repeats)
    for name, (save, load, size) in rows.items():
        s = base_save if name == "plain" else _best(save, args.repeats)
        lo = base_load if name == "plain" else _best(load, args.repeats)
        print(
            f"{name:<15} {s * 1e3:>9.1f} {s / base_save:>8.2f} {lo * 1e3:>9.1f} {lo / base_load:>8.2f} {size / 1024:>12.1f}"
        )


if __name__ == "__main__":
    main()
