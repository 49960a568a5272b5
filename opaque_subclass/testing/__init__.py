"""Testing helpers for subclass authors and tracer authors: the reusable
contract test (:class:`OpaqueSubclassContract`) and the one multi-process
launcher (:func:`run_local_workers`) that the demo, the examples and the test
suite use."""

from opaque_subclass.testing.contract import OpaqueSubclassContract, assert_same_leaves
from opaque_subclass.testing.workers import WorkersFailed, run_local_workers

__all__ = ["OpaqueSubclassContract", "WorkersFailed", "assert_same_leaves", "run_local_workers"]
