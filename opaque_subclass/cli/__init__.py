"""``python -m opaque_subclass``: report the mode on this torch, run live checks,
then the sharded-training demo (:mod:`opaque_subclass.cli.demo`; ``--no-demo`` skips it)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opaque_subclass",
        description="Report opaque-subclass support on the running torch and run live self-checks.",
    )
    parser.add_argument(
        "--no-demo",
        action="store_true",
        help="skip the demo (2 local processes training a sharded MLP under torch.compile)",
    )
    args = parser.parse_args(argv)

    import opaque_subclass

    info = opaque_subclass.support()
    print(f"opaque-subclass {opaque_subclass.__version__}")
    print(f"torch           {info.torch_version}")
    print(f"python          {sys.version.split()[0]}")
    print(f"mode            {info.mode}")
    print(f"patched         {len(info.patched)} torch function(s)")
    for name in info.patched:
        print(f"  - {name}")
    print(f"fixes           {len(info.fixes)} torch function(s)")
    for name in info.fixes:
        print(f"  - {name}")
    if info.others:
        print(f"other patchers  {len(info.others)} torch function(s) also replaced by other packages")
        for line in info.others:
            print(f"  - {line}")
    if info.problem is not None:
        print(f"problem         {info.problem}")
    if info.mode == "unsupported":
        print(unsupported_text(info.problem))
        return 1
    from opaque_subclass.cli.selfcheck import run_checks

    print("checks:")
    results = run_checks()
    for r in results:
        status = "PASS" if r.ok else "FAIL"
        print(f"  [{status}] {r.name} ({r.seconds * 1e3:.1f} ms): {r.detail}")
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    demo_ok = True if args.no_demo else run_demo_section()
    return 1 if failed or not demo_ok or info.problem is not None else 0


def unsupported_text(problem: str | None) -> str:
    """What to print on an unsupported torch: why (``problem``: a refused or
    removed patch set, else the release table's reason), what is supported, the fix."""
    from opaque_subclass.releases import RELEASES, current

    row = current()
    if problem is not None and row.mode != "unsupported":
        why = f"this build differs from the official {row.label} release ({problem})"
    else:
        why = "; ".join(map(str, row.differences)) or "no native support and no backport"
    supported = ", ".join(f"{r.label} ({r.mode})" for r in RELEASES.values() if r.mode != "unsupported")
    return (
        f"torch {row.label} is not supported: {why}.\n"
        f"supported torch releases: {supported}; newer releases run natively.\n"
        "Fix: python -m pip install 'torch>=2.11' (then run python -m opaque_subclass again)."
    )


def run_demo_section() -> bool:
    """Print the demo's report; ``False`` if it failed."""
    import torch.distributed

    print("demo: 2 local processes (gloo, 127.0.0.1) train a sharded MLP under torch.compile")
    if not torch.distributed.is_available():
        print("  [FAIL] torch.distributed is not available in this torch build. Fix: run with --no-demo.")
        return False
    from opaque_subclass.cli.demo import DemoError, run_demo

    try:
        report = run_demo()
    except DemoError as e:
        print("  [FAIL] " + str(e).replace("\n", "\n         "))
        return False
    lines = report.lines()
    print("  [PASS] " + lines[0])
    for line in lines[1:]:
        print("         " + line)
    return True


if __name__ == "__main__":
    sys.exit(main())
