"""Targets for the multi-process launcher's failure tests (tests/test_demo.py).

Importing this module in a worker of rank 1 started with ``die_at_import`` in
its target name ends that process before it joins the process group.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch.distributed as dist

if len(sys.argv) > 2 and sys.argv[1].endswith(":die_at_import") and sys.argv[2] == "1":
    os._exit(3)


def die_at_import(rank: int, world_size: int, payload: dict[str, Any]) -> int:
    return rank  # never reached by rank 1; rank 0 waits for it at the rendezvous


def killed_mid_run(rank: int, world_size: int, payload: dict[str, Any]) -> int:
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # rank 0 loses its peer here
    return rank
