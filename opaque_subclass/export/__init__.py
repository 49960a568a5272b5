"""Save exported programs with opaques, and load them with the loader's objects.

``torch.export.save`` pickles every object of a program by value, reference
opaques included: a ``DeviceMesh`` saved by one job and unpickled by another
names a process group that job never created. :func:`save` stores each
reference opaque by *name* and type (in a manifest inside the ``.pt2``
archive); :func:`load` binds every name to an object of the loading process::

    manifest = opaque_subclass.export.save(ep, "model.pt2")        # names: ('w._mesh',)
    ep = opaque_subclass.export.load("model.pt2", opaques={"w._mesh": mesh})

See ``docs/export.md`` ("Saving and loading") and
:mod:`opaque_subclass.export.archive` for what is stored and rebound.
"""

from opaque_subclass.export.archive import OpaqueBindingError, OpaqueName, load, read_manifest, save
from opaque_subclass.export.manifest import MANIFEST_NAME, ExportManifest, OpaqueRecord

__all__ = [
    "MANIFEST_NAME",
    "ExportManifest",
    "OpaqueBindingError",
    "OpaqueName",
    "OpaqueRecord",
    "load",
    "read_manifest",
    "save",
]
