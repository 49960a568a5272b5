"""Testing helpers for subclass authors and tracer authors: the reusable
contract test (:class:`OpaqueSubclassContract`) and the one multi-process
launcher (:func:`run_local_workers`) that the demo, the examples and the test
suite use, and the job simulator (:func:`simulate_job`)."""

from opaque_subclass.testing.contract import OpaqueSubclassContract, assert_same_leaves
from opaque_subclass.testing.jobs import JobReport, RankReport, simulate_job, spread_ranks
from opaque_subclass.testing.workers import WorkersFailed, run_local_workers

__all__ = [
    "JobReport",
    "OpaqueSubclassContract",
    "RankReport",
    "WorkersFailed",
    "assert_same_leaves",
    "run_local_workers",
    "simulate_job",
    "spread_ranks",
]
