"""Adopting tensor subclasses you do not own (``opaque_subclass.adopt``), and
presets for known ones.

:func:`opaque_subclass.adopt` declares which objects of an existing class's
flatten context are opaques; this package holds it
(:mod:`opaque_subclass.adoption.adopt`), the paths into a context and the
placeholder left there (:mod:`opaque_subclass.adoption.paths`), and presets:
one call per known class, with the declaration its maintainers' code needs.
See docs/adopting.md.
"""

from opaque_subclass.adoption.presets import physicsnemo_shard_tensor

__all__ = ["physicsnemo_shard_tensor"]
