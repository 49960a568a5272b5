"""The core: what an opaque is, the spec of a subclass, the one walk over it,
and what is built on the walk (flatten/unflatten, compiled wrap/unwrap, the
run-time helpers, the sharing pattern guards compare). No torch patches and no
version-specific code live here; the public names are re-exported by
:mod:`opaque_subclass`."""
