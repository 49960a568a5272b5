"""Opaque (non-tensor) attributes for PyTorch tensor subclasses.

``import opaque_subclass`` enables support on the running torch. The public API:

* registry - :class:`OpaqueBase`, :func:`register_opaque`, :func:`is_opaque`,
  :func:`opaque_kind`;
* schema - :class:`TensorSlot`, :class:`OpaqueSlot`, :class:`SymIntSlot`,
  :class:`SubclassLayout`, :func:`iter_slots`, :func:`iter_subclasses`;
* flatten - :func:`flatten_subclass`, :func:`unflatten_subclass`,
  :func:`describe_args`;
* run time - :func:`unwrap_args`, :func:`wrap_args`,
  :func:`wrap_args_maybe_joint`, :func:`unwrap_tangent`;
* guards - :func:`opaque_alias_pattern`, :class:`OpaqueAliasPattern`;
* authoring - :class:`OpaqueSubclass`, a declarative base class;
* adoption - :func:`adopt`, :func:`unadopt`, :func:`adoptions`, :class:`ContextOpaque`,
  :class:`Adoption`: objects of the flatten context of a class you do not own
  made opaque attributes (presets in :mod:`opaque_subclass.adoption`);
* modules - :func:`unwrap_subclass_parameters`, :func:`is_exportable_constructor`,
  :func:`untyped_storages`;
* mode - :func:`support`, :func:`enable`, :func:`disable`;
* :mod:`opaque_subclass.export` - ``save``/``load`` of exported programs whose
  reference opaques are stored by name and rebound at load (imported on first
  access).

See ``docs/`` for a guide.
"""

from typing import TYPE_CHECKING

from opaque_subclass import gate as _gate
from opaque_subclass.core.errors import (
    OpaqueAttributeError,
    OpaqueMemberError,
    OpaqueSubclassError,
    OpaqueTypeError,
    OpaqueValueError,
)
from opaque_subclass.mode import SUPPORTED_TORCH, Support
from opaque_subclass.releases import LIBRARY_VERSION

__version__ = LIBRARY_VERSION

# The version check comes first: on a torch without the feature, nothing
# release-specific is imported (opaque_subclass.gate says why).
if TYPE_CHECKING or _gate.REFUSAL is None:
    from opaque_subclass.activation import disable, enable, support
    from opaque_subclass.adoption.adopt import Adoption, ContextOpaque, adopt, adoptions, unadopt
    from opaque_subclass.authoring.base import OpaqueAttr, OpaqueSubclass
    from opaque_subclass.core.aliasing import OpaqueAliasPattern, opaque_alias_pattern
    from opaque_subclass.core.flatten import (
        describe_args,
        flatten_subclass,
        is_wrapper_subclass,
        unflatten_subclass,
    )
    from opaque_subclass.core.registry import (
        KIND_ALIASES,
        Member,
        OpaqueBase,
        OpaqueKind,
        is_opaque,
        opaque_kind,
        register_opaque,
    )
    from opaque_subclass.core.runtime import (
        unwrap_args,
        unwrap_tangent,
        wrap_args,
        wrap_args_maybe_joint,
    )
    from opaque_subclass.core.spec import (
        OpaqueSlot,
        SubclassLayout,
        SymIntSlot,
        TensorSlot,
        iter_slots,
        iter_subclasses,
    )
    from opaque_subclass.modules.parametrization import is_exportable_constructor, unwrap_subclass_parameters
    from opaque_subclass.modules.storage import untyped_storages

    enable()
else:
    from opaque_subclass.gate import OpaqueBase, disable, enable, is_opaque, opaque_kind, register_opaque, support

    _gate.unsupported_warning(_gate.REFUSAL, stacklevel=2)


def __getattr__(name: str) -> object:
    if _gate.REFUSAL is not None and (name in __all__ or name == "export"):
        raise _gate.refused_name(name)
    # opaque_subclass.export is imported on first access: it pulls in torch.export.
    if name == "export":
        import importlib

        return importlib.import_module(".export", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "KIND_ALIASES",
    "SUPPORTED_TORCH",
    "Adoption",
    "ContextOpaque",
    "Member",
    "OpaqueAliasPattern",
    "OpaqueAttr",
    "OpaqueAttributeError",
    "OpaqueBase",
    "OpaqueKind",
    "OpaqueMemberError",
    "OpaqueSlot",
    "OpaqueSubclass",
    "OpaqueSubclassError",
    "OpaqueTypeError",
    "OpaqueValueError",
    "SubclassLayout",
    "Support",
    "SymIntSlot",
    "TensorSlot",
    "__version__",
    "adopt",
    "adoptions",
    "describe_args",
    "disable",
    "enable",
    "flatten_subclass",
    "is_exportable_constructor",
    "is_opaque",
    "is_wrapper_subclass",
    "iter_slots",
    "iter_subclasses",
    "opaque_alias_pattern",
    "opaque_kind",
    "register_opaque",
    "support",
    "unadopt",
    "unflatten_subclass",
    "untyped_storages",
    "unwrap_args",
    "unwrap_subclass_parameters",
    "unwrap_tangent",
    "wrap_args",
    "wrap_args_maybe_joint",
]
