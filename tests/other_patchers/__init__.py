"""Stand-ins for other packages that patch the torch functions the library patches.

They live in a package of their own (``other_patchers``, not under ``torch`` or
``opaque_subclass``), so the library sees them as another package would be
seen. ``wrapping`` replaces AOTAutograd's ``process_runtime_tangent`` the way
NVIDIA PhysicsNeMo 2.2's ``physicsnemo.domain_parallel`` does (a function
closing over the original, stored back as a ``staticmethod``, with a marker
attribute); ``rewriting`` replaces it with a function that never calls torch's.
"""
