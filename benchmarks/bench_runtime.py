"""Benchmark of the run-time unwrap + wrap path.

Times, per call, ``unwrap_args`` followed by
``wrap_args(..., is_runtime=True)`` (what a compiled function does
on every call: subclass arguments in, flat leaves to the graph, subclasses
rebuilt from the flat list) for k = 1, 8, 64, 512 subclass arguments, and
compares it with torch's own helpers in
``torch._functorch._aot_autograd.subclass_utils`` on the same arguments, in the
same process.

Two variants of argument:

* ``flat``   - ``MeshTensor(_data=<tensor>, _mesh=<opaque>)``: one tensor and one
  reference opaque per argument;
* ``nested`` - ``MeshTensor(_data=MeshTensor(_data=<tensor>, _mesh=<opaque>),
  _mesh=<opaque>)``: one tensor and two opaques (one per level) per argument.

Rows:

* ``ours``          - ``opaque_subclass.unwrap_args(args, subclass_metas=metas)``
  + ``opaque_subclass.wrap_args(flat, subclass_metas=runtime_metas,
  is_runtime=True)``; the metas are made once with
  ``opaque_subclass.describe_args(args)`` (set-up, not timed);
* ``ours-specless`` - the same, but the unwrap gets no metas: it calls
  ``__tensor_flatten__`` and validates every attribute (secondary row; not
  checked by ``--check``);
* ``torch``         - ``subclass_utils.runtime_unwrap_tensor_subclasses`` +
  ``subclass_utils.wrap_tensor_subclasses(..., is_runtime=True)`` with metas
  made once by ``subclass_utils.create_subclass_meta`` from fake copies of the
  arguments and made runtime safe, as AOTAutograd does. Needs torch >= 2.12
  (native opaque support); on older torch the row is reported unavailable;
* ``floor``         - a hand-written unwrap + wrap for exactly these arguments (no
  library, no checks), shown in the linearity section: the cost of building
  the tensor objects themselves.

Before timing, both paths are run once and their results compared: the same
flat leaves (by identity) and rebuilt subclasses of the same type holding the
same tensors and opaques (by identity).

Usage::

    python benchmarks/bench_runtime.py [--quick] [--json PATH] [--check]

See benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

import opaque_subclass
from opaque_subclass import (
    OpaqueBase,
    SubclassLayout,
    describe_args,
    unwrap_args,
    wrap_args,
)

KS = (1, 8, 64, 512)
VARIANTS = ("flat", "nested")


# --------------------------------------------------------------------------
# The subclass and the opaque under test
# --------------------------------------------------------------------------


class Mesh(OpaqueBase):
    """A stand-in for a device mesh: a stateful object whose identity matters."""

    def __init__(self, ident: int) -> None:
        self.ident = ident

    def __repr__(self) -> str:
        return f"Mesh({self.ident})"


opaque_subclass.register_opaque(Mesh, kind="reference")


class MeshTensor(torch.Tensor):
    """A wrapper subclass holding one tensor (or MeshTensor) and one opaque."""

    _data: torch.Tensor
    _mesh: Mesh

    @staticmethod
    def __new__(cls, data: torch.Tensor, mesh: Mesh) -> MeshTensor:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls,
            data.shape,
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            device=data.device,
            requires_grad=False,
        )

    def __init__(self, data: torch.Tensor, mesh: Mesh) -> None:
        self._data = data
        self._mesh = mesh

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", "_mesh"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: Any, outer_size: Any, outer_stride: Any) -> MeshTensor:
        return MeshTensor(inner["_data"], inner["_mesh"])

    def __repr__(self) -> str:  # data-free: never prints (fake) data
        return f"MeshTensor(shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        mesh = None

        def unwrap(x: Any) -> Any:
            nonlocal mesh
            if isinstance(x, MeshTensor):
                mesh = x._mesh
                return x._data
            return x

        out = func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs))
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: MeshTensor(t, mesh), out)


def make_args(variant: str, k: int) -> list[MeshTensor]:
    """k subclass arguments, each with its own tensor and its own opaque(s)."""
    args = []
    for i in range(k):
        t = torch.randn(4, 3)
        if variant == "flat":
            args.append(MeshTensor(t, Mesh(i)))
        else:
            args.append(MeshTensor(MeshTensor(t, Mesh(2 * i)), Mesh(2 * i + 1)))
    return args


# --------------------------------------------------------------------------
# The two implementations
# --------------------------------------------------------------------------


def setup_ours(args: Sequence[Any]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(call, call_specless): one unwrap + wrap per call."""
    metas = describe_args(args)
    metas_rt = [m.runtime_safe() if isinstance(m, SubclassLayout) else m for m in metas]

    def call() -> Any:
        flat = unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
        return flat, wrap_args(flat, subclass_metas=metas_rt, is_runtime=True)

    def call_specless() -> Any:
        flat = unwrap_args(args, is_joint_structure=False)
        return flat, wrap_args(flat, subclass_metas=metas_rt, is_runtime=True)

    return call, call_specless


def setup_floor(args: Sequence[Any]) -> Callable[[], Any]:
    """Hand-written unwrap + wrap for exactly these arguments: no library, no checks.

    The cost of reading the attributes and calling ``__tensor_unflatten__`` per
    subclass; a reference for how much of the time (and of its growth with k)
    is building tensor objects rather than the helpers' own work.
    """
    unflatten = MeshTensor.__tensor_unflatten__
    size, stride = tuple(args[0].shape), args[0].stride()
    if isinstance(args[0]._data, MeshTensor):

        def call() -> Any:
            flat: list[Any] = []
            for a in args:
                inner = a._data
                flat += (inner._data, inner._mesh, a._mesh)
            wrapped = tuple(
                unflatten(
                    {
                        "_data": unflatten({"_data": flat[i], "_mesh": flat[i + 1]}, None, size, stride),
                        "_mesh": flat[i + 2],
                    },
                    None,
                    size,
                    stride,
                )
                for i in range(0, len(flat), 3)
            )
            return flat, wrapped

    else:

        def call() -> Any:
            flat: list[Any] = []
            for a in args:
                flat += (a._data, a._mesh)
            wrapped = tuple(
                unflatten({"_data": flat[i], "_mesh": flat[i + 1]}, None, size, stride) for i in range(0, len(flat), 2)
            )
            return flat, wrapped

    return call


def torch_native_reason() -> str | None:
    """Why torch's helpers cannot be compared on this torch, or None."""
    try:
        from torch._functorch._aot_autograd import schemas, subclass_utils  # noqa: F401
    except ImportError as e:  # pragma: no cover - torch without AOTAutograd
        return f"cannot import torch's subclass_utils ({e})"
    if not hasattr(schemas, "OpaqueMeta"):
        return (
            f"torch {torch.__version__} has no native opaque support "
            "(torch._functorch._aot_autograd.schemas.OpaqueMeta is missing; needs torch >= 2.12), "
            "so its subclass_utils cannot unwrap/wrap subclasses with opaque attributes"
        )
    return None


def setup_torch(args: Sequence[Any]) -> Callable[[], Any]:
    """torch's runtime unwrap + wrap, with metas made from fake copies of ``args``."""
    from torch._functorch._aot_autograd import subclass_utils
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta as TorchSCM
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode()
    # from_tensor converts a traceable wrapper subclass through
    # __tensor_flatten__: inner tensors become fake, opaques are kept as is.
    fake_args = [fake_mode.from_tensor(a) for a in args]
    with fake_mode:
        # count_symints=True is what AOTAutograd uses for inputs; with static
        # shapes there are no symbolic slots either way.
        metas = subclass_utils.create_subclass_meta(fake_args, count_symints=True)
    for m in metas:
        if isinstance(m, TorchSCM):
            m.make_runtime_safe()  # mutates in place
    included = any(isinstance(m, TorchSCM) and m.included_subclass_symints for m in metas)
    unwrap = subclass_utils.runtime_unwrap_tensor_subclasses
    wrap = subclass_utils.wrap_tensor_subclasses

    def call() -> Any:
        flat = unwrap(args, append_symints=False, subclass_metas=metas)
        return flat, wrap(flat, subclass_metas=metas, is_runtime=True, included_subclass_symints=included)

    return call


# --------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------


def _same_subclass(a: Any, b: Any, path: str) -> None:
    assert type(a) is type(b), f"{path}: type {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, MeshTensor):
        assert a.shape == b.shape and a.stride() == b.stride(), f"{path}: size/stride differ"
        assert a._mesh is b._mesh, f"{path}._mesh: different opaque objects"
        _same_subclass(a._data, b._data, f"{path}._data")
    else:
        assert a is b, f"{path}: different objects"


def verify(args: Sequence[Any], *calls: Callable[[], Any]) -> None:
    """All calls give the same flat leaves (by identity) and equivalent rebuilt args."""
    results = [c() for c in calls]
    for flat, wrapped in results:
        assert isinstance(flat, list) and isinstance(wrapped, tuple)
        assert len(wrapped) == len(args)
        for i, (w, a) in enumerate(zip(wrapped, args, strict=True)):
            assert w is not a, f"args[{i}] was not rebuilt"
            _same_subclass(w, a, f"args[{i}]")
    flat0 = results[0][0]
    expected_width = len(args) * (3 if isinstance(args[0]._data, MeshTensor) else 2)
    assert len(flat0) == expected_width, f"flat width {len(flat0)}, expected {expected_width}"
    for flat, _ in results[1:]:
        assert len(flat) == len(flat0), "flat widths differ"
        for j, (x, y) in enumerate(zip(flat, flat0, strict=True)):
            assert x is y, f"flat[{j}]: different objects ({type(x).__name__} vs {type(y).__name__})"
    for x in flat0:
        assert isinstance(x, (torch.Tensor, Mesh)) and not isinstance(x, MeshTensor)


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def _loop(fn: Callable[[], Any], n: int) -> float:
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0
    finally:
        if gc_was_enabled:
            gc.enable()


def calibrate(fn: Callable[[], Any], target_s: float) -> int:
    """Smallest n in 1, 2, 5, 10, 20, ... whose loop takes at least target_s."""
    n = 1
    while True:
        for mult in (1, 2, 5):
            m = n * mult
            if _loop(fn, m) >= target_s:
                return m
        n *= 10


def time_interleaved(
    cells: dict[tuple[str, int, str], Callable[[], Any]], target_s: float, repeats: int
) -> dict[tuple[str, int, str], dict[str, float]]:
    """Seconds per call of every cell (variant, k, impl).

    Each repeat times every cell once, round-robin, so slow drift of the
    machine (frequency, other load) affects all k and both implementations
    alike; the min over repeats is the figure least disturbed by noise.
    """
    iters = {key: calibrate(fn, target_s) for key, fn in cells.items()}
    samples: dict[tuple[str, int, str], list[float]] = {key: [] for key in cells}
    for _ in range(repeats):
        for key, fn in cells.items():
            samples[key].append(_loop(fn, iters[key]) / iters[key])
    return {
        key: {
            "min_s": min(s),
            "median_s": statistics.median(s),
            "iterations": iters[key],
            "repeats": repeats,
        }
        for key, s in samples.items()
    }


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test; figures are noisier)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if ours/torch > 1.0 anywhere, or if us/arg grows more than "
        "--linear-tolerance from k=8 to the largest k",
    )
    parser.add_argument(
        "--linear-tolerance",
        type=float,
        default=2.0,
        help="allowed growth of our us/arg from k=8 to the largest k (default 2.0)",
    )
    parser.add_argument(
        "--ks",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=KS,
        help="comma-separated k values (default 1,8,64,512)",
    )
    parser.add_argument(
        "--stat", choices=("min", "median"), default="min", help="statistic shown in the table (default min)"
    )
    opts = parser.parse_args(argv)

    target_s, repeats = (0.01, 3) if opts.quick else (0.04, 15)
    stat = f"{opts.stat}_s"
    reason = torch_native_reason()
    started = time.perf_counter()

    print(
        f"opaque-subclass runtime unwrap+wrap benchmark\n"
        f"torch {torch.__version__}, opaque_subclass {opaque_subclass.__version__} "
        f"(mode {opaque_subclass.support().mode}), Python {platform.python_version()}, "
        f"{platform.machine()}, {opts.stat} of {repeats} repeats of >= {target_s * 1e3:.0f} ms loops"
    )
    if reason is not None:
        print(f"torch comparison unavailable: {reason}.")

    # Set up and verify every cell first, then time them all round-robin.
    cells: dict[tuple[str, int, str], Callable[[], Any]] = {}
    torch_errors: dict[tuple[str, int], str | None] = {}
    keep_alive: list[Any] = []
    for variant in VARIANTS:
        for k in opts.ks:
            args = make_args(variant, k)
            keep_alive.append(args)
            ours, ours_specless = setup_ours(args)
            cells[variant, k, "ours"] = ours
            cells[variant, k, "ours-specless"] = ours_specless
            cells[variant, k, "floor"] = floor = setup_floor(args)
            # Tried on every torch: on one without native opaque support this
            # fails (reported below) unless torch has learnt opaques after all.
            try:
                theirs = setup_torch(args)
                theirs()
            except Exception as e:  # torch could not handle the arguments at all
                msg = str(e).splitlines()[0] if str(e) else ""
                where = traceback.extract_tb(e.__traceback__)[-1]
                torch_errors[variant, k] = (
                    f"{type(e).__name__}: {msg} (at {where.filename.rsplit('site-packages/', 1)[-1]}:{where.lineno})"
                )
                verify(args, ours, ours_specless, floor)
            else:
                verify(args, ours, ours_specless, floor, theirs)
                cells[variant, k, "torch"] = theirs
                torch_errors[variant, k] = None
    for err in dict.fromkeys(e for e in torch_errors.values() if e is not None):
        cases = ", ".join(f"{v} k={k}" for (v, k), e in torch_errors.items() if e == err)
        print(f"torch's helpers failed on these arguments ({cases}): {err}")
    compared = any(key[2] == "torch" for key in cells)
    print(
        "verified: "
        + ("ours, ours-specless and torch" if compared else "ours and ours-specless")
        + " give identical flat leaves and rebuilt arguments"
    )

    timing = time_interleaved(cells, target_s, repeats)

    rows: list[dict[str, Any]] = []
    for variant in VARIANTS:
        for k in opts.ks:
            tt = timing.get((variant, k, "torch"))
            torch_s = None if tt is None else tt[stat]
            for impl in ("ours", "ours-specless", "floor"):
                t = timing[variant, k, impl]
                rows.append(
                    {
                        "variant": variant,
                        "k": k,
                        "impl": impl,
                        "us_per_call": t[stat] * 1e6,
                        "us_per_arg": t[stat] * 1e6 / k,
                        "torch_us_per_call": None if torch_s is None else torch_s * 1e6,
                        "torch_us_per_arg": None if torch_s is None else torch_s * 1e6 / k,
                        "ratio": None if torch_s is None else t[stat] / torch_s,
                        "min_us_per_call": t["min_s"] * 1e6,
                        "median_us_per_call": t["median_s"] * 1e6,
                        "torch_min_us_per_call": None if tt is None else tt["min_s"] * 1e6,
                        "torch_median_us_per_call": None if tt is None else tt["median_s"] * 1e6,
                        "iterations": t["iterations"],
                        "torch_iterations": None if tt is None else tt["iterations"],
                        "repeats": repeats,
                        "torch_unavailable": torch_errors[variant, k],
                    }
                )

    def fmt(x: float | None, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    header = (
        f"{'variant':<8} {'k':>5} {'impl':<14} {'ours us/call':>13} {'ours us/arg':>12} "
        f"{'torch us/call':>14} {'torch us/arg':>13} {'ours/torch':>11}"
    )
    print()
    print(header)
    print("-" * len(header))
    for impl in ("ours", "ours-specless"):
        for r in rows:
            if r["impl"] != impl:
                continue
            print(
                f"{r['variant']:<8} {r['k']:>5} {r['impl']:<14} {r['us_per_call']:>13.2f} "
                f"{r['us_per_arg']:>12.3f} {fmt(r['torch_us_per_call'], '>14.2f'):>14} "
                f"{fmt(r['torch_us_per_arg'], '>13.3f'):>13} {fmt(r['ratio'], '>11.3f'):>11}"
            )
        print()

    # Linearity: us/arg relative to k=8 (k=1 carries the fixed per-call cost).
    base_k = 8 if 8 in opts.ks else min(opts.ks)
    kmax = max(opts.ks)
    linearity: list[dict[str, Any]] = []
    print(f"Linearity: us/arg at each k, and growth = us/arg(k={kmax}) / us/arg(k={base_k})")
    for impl in ("ours", "ours-specless", "torch", "floor"):
        for variant in VARIANTS:
            if any((variant, k, impl) not in timing for k in opts.ks):
                continue
            per_arg = {k: timing[variant, k, impl][stat] * 1e6 / k for k in opts.ks}
            growth = per_arg[kmax] / per_arg[base_k]
            linearity.append({"impl": impl, "variant": variant, "us_per_arg": per_arg, "growth": growth})
            line = "  ".join(f"k={k}: {v:.3f}" for k, v in per_arg.items())
            print(f"  {impl:<14} {variant:<7} {line}  growth {growth:.2f}")
    print(
        "  (floor: hand-written attribute reads + __tensor_unflatten__ calls, no library: the\n"
        "   cost of building the tensor objects, and how much of the growth is due to it)"
    )

    elapsed = time.perf_counter() - started
    print(f"\ntotal {elapsed:.1f} s")

    failures: list[str] = []
    for r in rows:
        if r["impl"] == "ours" and r["ratio"] is not None and r["ratio"] > 1.0:
            failures.append(f"ours slower than torch: {r['variant']} k={r['k']} ratio {r['ratio']:.3f}")
    notes: list[str] = []
    for lin in linearity:
        if lin["impl"] == "ours" and lin["growth"] > opts.linear_tolerance:
            # --quick loops are too short at k=512 for a reliable growth figure.
            (notes if opts.quick else failures).append(
                f"ours not linear: {lin['variant']} us/arg grows {lin['growth']:.2f}x from "
                f"k={base_k} to k={kmax} (tolerance {opts.linear_tolerance})"
            )
    if reason is None:
        # torch has native opaque support, so the comparison is required.
        for (variant, k), err in torch_errors.items():
            if err is not None:
                failures.append(f"torch comparison failed on torch {torch.__version__}: {variant} k={k}: {err}")
    if not any(r["ratio"] is not None for r in rows):
        print("no torch comparison on this torch: --check covers linearity only")

    if opts.json:
        payload = {
            "benchmark": "runtime_unwrap_wrap",
            "torch": torch.__version__,
            "opaque_subclass": opaque_subclass.__version__,
            "mode": opaque_subclass.support().mode,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "stat": opts.stat,
            "quick": opts.quick,
            "target_loop_s": target_s,
            "repeats": repeats,
            "ks": list(opts.ks),
            "torch_comparison_unavailable": reason,
            "rows": rows,
            "linearity": linearity,
            "failures": failures,
            "notes": notes,
            "elapsed_s": elapsed,
        }
        with open(opts.json, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {opts.json}")

    if notes:
        print("\n" + "\n".join(f"note (--quick, not checked): {n}" for n in notes))
    if failures:
        print("\n" + "\n".join(("FAIL: " if opts.check else "warning: ") + f for f in failures))
        if opts.check:
            return 1
    elif opts.check:
        print("check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
