"""``python -m opaque_subclass``: report the mode on this torch and run live checks."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opaque_subclass",
        description="Report opaque-subclass support on the running torch and run live self-checks.",
    )
    parser.parse_args(argv)

    import opaque_subclass
    from opaque_subclass.selfcheck import run_checks

    info = opaque_subclass.support()
    print(f"opaque-subclass {opaque_subclass.__version__}")
    print(f"torch           {info.torch_version}")
    print(f"python          {sys.version.split()[0]}")
    print(f"mode            {info.mode}")
    print(f"patched         {len(info.patched)} torch function(s)")
    for name in info.patched:
        print(f"  - {name}")
    if info.mode == "unsupported":
        print("torch version not supported: nothing to check.")
        return 1
    print("checks:")
    results = run_checks()
    for r in results:
        status = "PASS" if r.ok else "FAIL"
        print(f"  [{status}] {r.name} ({r.seconds * 1e3:.1f} ms): {r.detail}")
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
