"""Compiler-side tools built on :mod:`opaque_subclass`, one concept per module.

* :func:`explain` (``explain.py``) - compile a call and report, per graph, its
  flat inputs (with the attribute path each came from and which opaques share
  one object), the flatten contexts torch guards on, the objects baked into the
  graph, the findings, and the recompilations of later calls in opaque terms.
* Lints with stable codes (``findings.py``): OSC001 reference-like objects in a
  flatten context (``context.py``), OSC002 reference-like objects baked into a
  graph (``baked.py``), OSC003 inputs whose opaque sharing is guarded
  (``guards.py``, which also translates recompile reasons), OSC004 values read
  from an opaque while tracing and compiled in (``reads.py``: Dynamo's reads,
  recorded by the library's member fix, and reads below Dynamo, watched while
  the inner backend compiles), OSC005 collectives on a process group the graph
  names by a constant (``collectives.py``: in Dynamo's graph, and issued below
  Dynamo, such as DTensor's, seen by the same watcher).
* :func:`checking_backend` / ``backend="opaque_check"`` (``backend.py``) - the
  lints on every graph, reported before the inner backend compiles it, then an
  inner backend (watched for reads and collectives below Dynamo with
  ``watch_reads=True``, as ``explain`` does).
* ``ordering.py`` - :class:`~compile_passes.ordering.FindingsFirst`: ``explain``
  logs its findings before torch's first warning or error of a call (a guard
  torch fails to build), leaving torch's records as they are.
* :func:`explain_flat_inputs` (``inputs.py``) - the flat inputs of an argument list.

This package depends on :mod:`opaque_subclass`; the reverse never holds.
"""

from .backend import GraphCheck, check_graph, checking_backend, opaque_check
from .baked import BakedObject, baked_objects, lint_baked
from .collectives import BakedGroup, baked_groups, lint_collectives
from .context import lint_contexts, reference_reason
from .explain import Explanation, Recompile, explain
from .findings import CODES, Finding, OpaqueCheckError, OpaqueCheckWarning
from .guards import lint_sharing, translate_guard
from .inputs import FlatInput, InputReport, explain_flat_inputs

__all__ = [
    "CODES",
    "BakedGroup",
    "BakedObject",
    "Explanation",
    "Finding",
    "FlatInput",
    "GraphCheck",
    "InputReport",
    "OpaqueCheckError",
    "OpaqueCheckWarning",
    "Recompile",
    "baked_groups",
    "baked_objects",
    "check_graph",
    "checking_backend",
    "explain",
    "explain_flat_inputs",
    "lint_baked",
    "lint_collectives",
    "lint_contexts",
    "lint_sharing",
    "opaque_check",
    "reference_reason",
    "translate_guard",
]
