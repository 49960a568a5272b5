"""Testing helpers for subclass authors and tracer authors: the reusable
contract test (:class:`OpaqueSubclassContract`) and the one multi-process
launcher (:func:`run_local_workers`) that the demo, the examples and the test
suite use, the job simulator (:func:`simulate_job`), and
:class:`WarmInterpreters`, which starts their processes by forking a server
that has already imported torch."""

from opaque_subclass.testing.contract import OpaqueSubclassContract, assert_same_leaves
from opaque_subclass.testing.jobs import JobReport, RankReport, simulate_job, spread_ranks
from opaque_subclass.testing.warm import WarmInterpreters, WarmProcess
from opaque_subclass.testing.workers import WorkersFailed, run_local_workers

__all__ = [
    "JobReport",
    "OpaqueSubclassContract",
    "RankReport",
    "WarmInterpreters",
    "WarmProcess",
    "WorkersFailed",
    "assert_same_leaves",
    "run_local_workers",
    "simulate_job",
    "spread_ranks",
]
