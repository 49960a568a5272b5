"""Write (or check) docs/errors.md: every error the library raises for bad input,
each with its exception type, its cause, the message the library produces and
the fix.

Usage::

    python docs/gen_errors.py           # rewrite docs/errors.md
    python docs/gen_errors.py --check   # exit 1, with a diff, if the page is out of date

The messages are not typed here: every entry has a trigger, a few lines of code
against the public API, which this script runs (after its group's set-up code)
in a fresh module named ``__main__``, as a user's script would; the page shows
the message of the exception it raises. A trigger that raises nothing, raises
another exception type than its entry says, or raises outside the library
stops the script. Only the members group compiles (its error exists only in
compiled code, where Dynamo appends the user's line to it, as the page says):
for everything else torch.compile and torch.export reach the same checks
through the same walk and produce the same messages, with another root in
attribute paths (``L['x']._mesh`` for ``x._mesh``).

Every entry also has a ``fixed`` variant (unless ``NOT_FIXED`` says why not):
the trigger with the message's fix applied. ``{fix}`` in it stands for the
message's first backticked snippet after ``Fix:``, so the snippet itself runs.
The fixed variants run after all triggers (they register classes, which later
triggers must not see), each in a copy of its trigger's namespace; one that
raises, or that leaves out the message's snippet, stops the script. They are
not shown on the page.

The page is the same on every supported torch (checked on 2.11 and 2.15): no
message shown depends on the release.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling _pages module
from _pages import write_or_check

PAGE = Path(__file__).resolve().parent / "errors.md"
ROOT = PAGE.parent.parent
# The library of this checkout, whatever copy of the package is installed.
sys.path.insert(0, str(ROOT))
WIDTH = 100  # messages are wrapped at this many columns, as in docs/core.md


@dataclass(frozen=True)
class Entry:
    """One error: ``code`` (run after its group's set-up) must raise ``error``."""

    key: str  # anchor on the page
    error: str  # the exception type's name
    title: str
    cause: str
    code: str
    fix: str
    # The trigger with the message's fix applied, which must raise nothing; a
    # line (or part of one) ``{fix}`` is replaced by the message's first
    # backticked snippet after "Fix:", so the snippet itself runs. Not shown.
    fixed: str = ""


@dataclass(frozen=True)
class Group:
    key: str
    title: str
    intro: str
    setup: str  # runnable code shown before the entries ("" for none)
    entries: tuple[Entry, ...]


def _code(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def _e(key: str, error: str, title: str, cause: str, code: str, fix: str, fixed: str = "") -> Entry:
    return Entry(key, error, title, " ".join(cause.split()), _code(code), " ".join(fix.split()), _code(fixed))


# ---------------------------------------------------------------------- the entries

SETUP = _code(
    '''
    import io
    from collections import namedtuple

    import torch
    from torch.utils._pytree import tree_map_only

    import opaque_subclass as osc
    from opaque_subclass import OpaqueBase, OpaqueSubclass


    class Mesh(OpaqueBase):  # a reference opaque: its identity matters
        def __init__(self, name="dp"):
            self.name = name

        def __repr__(self):
            return f"Mesh({self.name!r})"


    class Config(OpaqueBase):  # a value opaque: a constant, compared with ==
        def __init__(self, bits):
            self.bits = bits

        def __eq__(self, other):
            return isinstance(other, Config) and other.bits == self.bits

        def __hash__(self):
            return hash(self.bits)

        def __repr__(self):
            return f"Config({self.bits})"

        def __fx_repr__(self):
            return f"Config({self.bits})", {"Config": Config}


    class Handle:  # never registered
        pass


    osc.register_opaque(Mesh)
    osc.register_opaque(Config, kind="value")


    class MeshTensor(torch.Tensor):
        """A hand-written wrapper subclass: a tensor and a mesh as attributes, a tag in the context."""

        @staticmethod
        def __new__(cls, data, mesh, tag="t"):
            t = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)
            t._data, t._mesh, t._tag = data, mesh, tag
            return t

        def __repr__(self):
            return f"MeshTensor(mesh={self._mesh!r}, tag={self._tag!r})"

        def __tensor_flatten__(self):
            return ["_data", "_mesh"], self._tag

        @classmethod
        def __tensor_unflatten__(cls, inner, tag, outer_size, outer_stride):
            return cls(inner["_data"], inner["_mesh"], tag)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            mesh, tag = next((a._mesh, a._tag) for a in args if isinstance(a, cls))
            out = func(*tree_map_only(cls, lambda t: t._data, args), **(kwargs or {}))
            return tree_map_only(torch.Tensor, lambda t: cls(t, mesh, tag), out)


    x = MeshTensor(torch.ones(2), Mesh())
    '''
)

REGISTRATION = Group(
    "registration",
    "Registering an opaque class: `register_opaque`",
    '`osc.register_opaque(cls, kind="reference")` checks the class before entering it in torch\'s '
    "registry; nothing is registered when it raises.",
    "",
    (
        _e(
            "register-instance",
            "OpaqueTypeError",
            "an instance instead of a class",
            "`register_opaque` was given an object, not its class.",
            "osc.register_opaque(Mesh())",
            "Pass the class: `register_opaque(Mesh)`, or `register_opaque(type(obj))`.",
            fixed="""
                osc.register_opaque(type(Mesh()))
            """,
        ),
        _e(
            "register-kind",
            "OpaqueValueError",
            "an unknown kind",
            """`kind` is none of `"reference"`, `"value"` or torch 2.14's aliases `"symbolic"` and
            `"constant"`.""",
            'osc.register_opaque(Mesh, kind="ref")',
            """`kind="reference"` for an object whose identity matters (a mesh, a process group, a
            stream), `kind="value"` for a constant compared with `==`.""",
            fixed="""
                osc.register_opaque(Mesh, kind="reference")
            """,
        ),
        _e(
            "register-builtin",
            "OpaqueTypeError",
            "a builtin or a tensor class",
            "The class is a builtin (`int`, `str`, ...) or a `torch.Tensor` subclass; torch handles those itself.",
            "osc.register_opaque(int)",
            """Keep a plain value in the flatten context (the second value `__tensor_flatten__`
            returns); wrap an object whose identity matters in a class of your own and register
            that class.""",
            fixed="""
                class Count(OpaqueBase):
                    def __init__(self, n):
                        self.n = n


                osc.register_opaque(Count)
            """,
        ),
        _e(
            "register-torch-type",
            "OpaqueTypeError",
            "one of torch's own value types",
            """The class is `torch.dtype`, `torch.device`, `torch.layout`, `torch.memory_format`,
            `torch.Size`, `torch.qscheme` or a `torch.nn.Module`: torch.compile specializes on such
            values, and registering one would change that for every compiled program in the process.""",
            "osc.register_opaque(torch.device)",
            "Keep the value in the flatten context, or as a plain attribute read outside the compiled region.",
            fixed="""
                osc.flatten_subclass(MeshTensor(torch.ones(2), Mesh(), torch.device("cpu")))
            """,
        ),
        _e(
            "register-pytree",
            "OpaqueTypeError",
            "a pytree node",
            """The class is registered with `torch.utils._pytree` (or is a namedtuple), so torch
            would flatten its instances instead of passing each as one object.""",
            """
            Point = namedtuple("Point", "x y")
            osc.register_opaque(Point)
            """,
            "Wrap the value in a class that is not a pytree node, and register that class.",
            fixed="""
                class PointBox(OpaqueBase):
                    def __init__(self, point):
                        self.point = point


                osc.register_opaque(PointBox)
            """,
        ),
        _e(
            "register-other-kind",
            "OpaqueValueError",
            "the other kind than before",
            """The class (or a base class of it) is registered already with the other kind; the
            first registration fixes the kind for the process (torch has no way to unregister).""",
            'osc.register_opaque(Mesh, kind="value")',
            """Keep one registration. To change the kind, change the first registration and start a
            fresh process.""",
            fixed="""
                osc.register_opaque(Mesh, kind="reference")
            """,
        ),
        _e(
            "register-value-protocol",
            "OpaqueTypeError",
            "a value opaque without `__eq__`, `__hash__` or `__fx_repr__`",
            """A value opaque is a constant that compiled graphs guard on with `==`, hash for
            caching and rebuild in generated code; the message lists what the class lacks.""",
            """
            class Tag(OpaqueBase):
                pass


            osc.register_opaque(Tag, kind="value")
            """,
            """Define the missing methods (see `Config` in the set-up above), or register the class as a
            reference opaque if its identity matters.""",
            fixed="""
                {fix}
                """,
        ),
        _e(
            "register-members",
            "OpaqueTypeError",
            "a member declared without saying how it is used",
            """`members` maps each member name to `osc.Member.USE_REAL` (evaluated on the real object
            while tracing, compiled in and guarded) or `osc.Member.INLINED` (traced); anything else
            is refused.""",
            """
            class Meter(OpaqueBase):
                def factor(self):
                    return 2


            osc.register_opaque(Meter, members={"factor": 1})
            """,
            "Name the member's use with `osc.Member`.",
            fixed="""
                osc.register_opaque(Meter, members={"factor": osc.Member.USE_REAL})
                """,
        ),
        _e(
            "register-hoist-reference",
            "OpaqueValueError",
            "`hoist=True` for a reference opaque",
            """`hoist` lifts a *value* opaque to a graph input instead of compiling it in; a reference
            opaque is a graph input already.""",
            "osc.register_opaque(Handle, hoist=True)",
            "Drop `hoist=` for a reference opaque.",
            fixed="""
                osc.register_opaque(Handle, kind="reference")
                """,
        ),
        _e(
            "register-options-changed",
            "OpaqueValueError",
            "registering again with other options",
            """The class is registered already with other members, guard, hoist or reconstruct
            options; torch cannot change a registration.""",
            """
            class Counter(OpaqueBase):
                def count(self):
                    return 1


            osc.register_opaque(Counter)
            osc.register_opaque(Counter, members={"count": osc.Member.USE_REAL})
            """,
            """Register the class once, with every option, before anything uses it (a fresh process
            to change it); registering it again without options keeps the entry it has.""",
            fixed="""
                {fix}
                """,
        ),
    ),
)

DECLARING = Group(
    "declaring",
    "Declaring an `OpaqueSubclass`",
    """An `OpaqueSubclass` is checked when its class statement runs, so these errors point at the
    declaration, not at first use. Each message starts with the class's qualified name.""",
    "",
    (
        _e(
            "declare-string",
            "OpaqueTypeError",
            "a string instead of a tuple of names",
            "`tensor_attrs`, `opaque_attrs` or `meta_attrs` is a single string (a tuple of one name is missing its comma).",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = "_data"
            """,
            'A tuple: `tensor_attrs = ("_data",)`.',
            fixed="""
                class Scaled(OpaqueSubclass):
                    {fix}
            """,
        ),
        _e(
            "declare-not-a-tuple",
            "OpaqueTypeError",
            "names in something other than a tuple or list",
            "A group of names is a set, a dict or another object; its order would not be fixed.",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = {"_data"}
            """,
            'A tuple, in the order the flat slots should have: `tensor_attrs = ("_data",)`.',
            fixed="""
                class Scaled(OpaqueSubclass):
                    {fix}
            """,
        ),
        _e(
            "declare-bad-name",
            "OpaqueTypeError",
            "a name that is not an identifier",
            "An entry is not a string, not a Python identifier, or a keyword.",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("2d",)
            """,
            'Use a valid attribute name, as the message suggests: `tensor_attrs = ("_2d",)`.',
            fixed="""
                class Scaled(OpaqueSubclass):
                    {fix}
            """,
        ),
        _e(
            "declare-shadow",
            "OpaqueTypeError",
            "a name that shadows a `torch.Tensor` attribute",
            "An entry has the name of an attribute of `torch.Tensor` (`data`, `grad`, `shape`, ...).",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("data",)
            """,
            "Rename it; a leading underscore is the convention: `_data`.",
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
            """,
        ),
        _e(
            "declare-no-tensor",
            "OpaqueTypeError",
            "no inner tensor",
            """`tensor_attrs` is empty: a wrapper subclass needs at least one inner tensor, from
            which torch builds fake and functional copies while tracing.""",
            """
            class Scaled(OpaqueSubclass):
                opaque_attrs = {"_mesh": Mesh}
            """,
            'Declare the data: `tensor_attrs = ("_data",)`.',
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    opaque_attrs = {"_mesh": Mesh}
            """,
        ),
        _e(
            "declare-opaques-not-mapping",
            "OpaqueTypeError",
            "`opaque_attrs` is not a mapping",
            "`opaque_attrs` lists names without their classes.",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("_data",)
                opaque_attrs = ("_mesh",)
            """,
            'Map each name to its opaque class: `opaque_attrs = {"_mesh": Mesh}`.',
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    opaque_attrs = {"_mesh": Mesh}
            """,
        ),
        _e(
            "declare-two-groups",
            "OpaqueTypeError",
            "one name in two groups",
            "A name appears in more than one of `tensor_attrs`, `opaque_attrs` and `meta_attrs`.",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("_data",)
                meta_attrs = ("_data",)
            """,
            "Keep the name in one group (tensors, opaques or metadata); rename the other attribute.",
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    {fix}
            """,
        ),
        _e(
            "declare-opaque-not-a-class",
            "OpaqueTypeError",
            "an object instead of a class in `opaque_attrs`",
            "A value of `opaque_attrs` is an instance, not the class of the opaque.",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("_data",)
                opaque_attrs = {"_mesh": Mesh()}
            """,
            'Name the class: `opaque_attrs = {"_mesh": Mesh}`; the object is passed to the constructor.',
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    {fix}


                Scaled(torch.ones(2), Mesh())
            """,
        ),
        _e(
            "declare-opaque-tensor",
            "OpaqueTypeError",
            "a tensor class in `opaque_attrs`",
            "A value of `opaque_attrs` is `torch.Tensor` or a subclass of it.",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("_data",)
                opaque_attrs = {"_scale": torch.Tensor}
            """,
            "Declare the attribute in `tensor_attrs`.",
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data", "_scale")
            """,
        ),
        _e(
            "declare-opaque-plain-type",
            "OpaqueTypeError",
            "a plain value type in `opaque_attrs`",
            """A value of `opaque_attrs` is a builtin (`int`, `str`, ...) or one of torch's value
            types (`torch.dtype`, `torch.device`, ...), which cannot be opaques.""",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("_data",)
                opaque_attrs = {"_dim": int}
            """,
            "Declare the attribute in `meta_attrs` (metadata, kept in the flatten context).",
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    meta_attrs = ("_dim",)
            """,
        ),
        _e(
            "declare-opaque-value",
            "OpaqueTypeError",
            "a value opaque in `opaque_attrs`",
            """The class is registered as a value opaque: a constant that compiled graphs bake in,
            which belongs in the flatten context, not in a flat slot.""",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("_data",)
                opaque_attrs = {"_cfg": Config}
            """,
            "Declare the attribute in `meta_attrs`.",
            fixed="""
                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    meta_attrs = ("_cfg",)


                Scaled(torch.ones(2), Config(8))
            """,
        ),
        _e(
            "declare-opaque-unregistered",
            "OpaqueTypeError",
            "an unregistered class in `opaque_attrs`",
            "The class is not registered as an opaque when the class statement runs.",
            """
            class Scaled(OpaqueSubclass):
                tensor_attrs = ("_data",)
                opaque_attrs = {"_handle": Handle}
            """,
            """Register it first, `osc.register_opaque(Handle)`, or declare the subclass with
            `register_opaques=True` (`class Scaled(OpaqueSubclass, register_opaques=True)`) to
            register it when the first instance is built.""",
            fixed="""
                {fix}


                class Scaled(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    opaque_attrs = {"_handle": Handle}


                Scaled(torch.ones(2), Handle())
            """,
        ),
        _e(
            "declare-pending-became-value",
            "OpaqueTypeError",
            "a class left to `register_opaques=True` was registered as a value opaque",
            """The subclass was declared with `register_opaques=True`, and before its first instance
            something else registered the opaque class as a value opaque.""",
            """
            class Codec(OpaqueBase):
                def __eq__(self, other):
                    return isinstance(other, Codec)

                def __hash__(self):
                    return 0

                def __fx_repr__(self):
                    return "Codec()", {"Codec": Codec}


            class Coded(OpaqueSubclass, register_opaques=True):
                tensor_attrs = ("_data",)
                opaque_attrs = {"_codec": Codec}


            osc.register_opaque(Codec, kind="value")  # elsewhere, before the first Coded
            Coded(torch.ones(2), Codec())
            """,
            """Register the class as a reference opaque (before any other registration), or declare
            the attribute in `meta_attrs` if it is a constant.""",
            fixed="""
                class Coded(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    meta_attrs = ("_codec",)


                Coded(torch.ones(2), Codec())
            """,
        ),
    ),
)

CONSTRUCTING = Group(
    "constructing",
    "Building an `OpaqueSubclass` and running ops on it",
    """An `OpaqueSubclass` takes its values in declaration order (tensors, opaques, metadata) or
    by keyword, and checks each. Its default `__torch_dispatch__` rule applies an op to each inner
    tensor and rewraps the results with the arguments' opaques and metadata.""",
    """
    class Sharded(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}
        meta_attrs = ("_dim",)


    s = Sharded(torch.ones(2), Mesh(), 0)
    """,
    (
        _e(
            "construct-base",
            "OpaqueTypeError",
            "`OpaqueSubclass` itself",
            "`OpaqueSubclass` was instantiated directly; it declares nothing.",
            "OpaqueSubclass(torch.ones(2))",
            "Subclass it and declare `tensor_attrs` (and `opaque_attrs`, `meta_attrs`).",
            fixed="""
                {fix}
                Scaled(torch.ones(2))
            """,
        ),
        _e(
            "construct-too-many",
            "OpaqueTypeError",
            "too many values",
            "More positional values than declared attributes.",
            "Sharded(torch.ones(2), Mesh(), 0, 1)",
            "Pass one value per declared attribute, in the order the message lists them.",
            fixed="""
                Sharded(torch.ones(2), Mesh(), 0)
            """,
        ),
        _e(
            "construct-unexpected",
            "OpaqueTypeError",
            "an unknown keyword",
            "A keyword argument names no declared attribute.",
            "Sharded(torch.ones(2), Mesh(), dim=0)",
            "Use the declared names (`_dim=0`); the message lists them.",
            fixed="""
                Sharded(torch.ones(2), Mesh(), _dim=0)
            """,
        ),
        _e(
            "construct-twice",
            "OpaqueTypeError",
            "a value given by position and by keyword",
            "The same attribute was given positionally and by keyword.",
            "Sharded(torch.ones(2), Mesh(), 0, _dim=0)",
            "Give each value once.",
            fixed="""
                Sharded(torch.ones(2), Mesh(), 0)
            """,
        ),
        _e(
            "construct-missing",
            "OpaqueTypeError",
            "a missing value",
            "A declared attribute got no value.",
            "Sharded(torch.ones(2), Mesh())",
            "Pass every declared attribute (metadata too: `Sharded(data, mesh, 0)`).",
            fixed="""
                Sharded(torch.ones(2), Mesh(), _dim=0)
            """,
        ),
        _e(
            "construct-not-a-tensor",
            "OpaqueTypeError",
            "a non-tensor for a tensor attribute",
            "A value for an attribute of `tensor_attrs` is not a tensor.",
            "Sharded([1.0, 2.0], Mesh(), 0)",
            "Pass a tensor: `Sharded(torch.tensor([1.0, 2.0]), mesh, 0)`.",
            fixed="""
                Sharded(_data=torch.as_tensor([1.0, 2.0]), _mesh=Mesh(), _dim=0)
            """,
        ),
        _e(
            "construct-wrong-opaque",
            "OpaqueTypeError",
            "an object of another class for an opaque attribute",
            "A value for an attribute of `opaque_attrs` is not an instance of the declared class.",
            "Sharded(torch.ones(2), Handle(), 0)",
            "Pass an object of the declared class (the mesh itself, not a name or a copy of its fields).",
            fixed="""
                Sharded(torch.ones(2), Mesh(), 0)
            """,
        ),
        _e(
            "construct-requires-grad",
            "OpaqueValueError",
            "`requires_grad=True` with an inner tensor that requires grad",
            """`requires_grad=True` asks for a leaf, but an inner tensor requires grad, so the
            result would be computed from it.""",
            "Sharded(torch.ones(2, requires_grad=True), Mesh(), 0, requires_grad=True)",
            """Pass a detached inner tensor for a leaf, or drop `requires_grad=True` to stay
            differentiable with respect to the inner tensor.""",
            fixed="""
                Sharded(torch.ones(2, requires_grad=True).detach(), Mesh(), 0, requires_grad=True)
            """,
        ),
        _e(
            "wrap-like",
            "OpaqueSubclassError",
            "`wrap_like` with other names than the inner tensors",
            """`wrap_like(**tensors)` takes exactly the attributes of `tensor_attrs`, each a tensor;
            opaques and metadata always come from the instance. It raises `OpaqueSubclassError`,
            not `TypeError`, because inside a Python operator torch turns a `TypeError` into
            `NotImplemented`.""",
            "s.wrap_like(_data=s._data * 2, _mesh=Mesh())",
            "Pass every inner tensor; to change an opaque or metadata, build a new instance.",
            fixed="""
                x = s
                {fix}
            """,
        ),
        _e(
            "implements-on-base",
            "OpaqueTypeError",
            "`implements` on `OpaqueSubclass` itself",
            "`OpaqueSubclass.implements(...)` would register a rule for every subclass.",
            "OpaqueSubclass.implements(torch.ops.aten.mul)",
            "Register on your class: `@Sharded.implements(torch.ops.aten.mul)`.",
            fixed="""
                {fix}
            """,
        ),
        _e(
            "dispatch-different-opaques",
            "OpaqueSubclassError",
            "an op on arguments with different opaques",
            """The default rule got two arguments of the class whose opaque attribute holds different
            objects (compared by identity): the op has no single meaning.""",
            "s + Sharded(torch.ones(2), Mesh(), 0)",
            """Bring the arguments to one mesh first, or register a rule for the op with
            `@Sharded.implements(...)`.""",
            fixed="""
                s + Sharded(torch.ones(2), s._mesh, 0)
            """,
        ),
        _e(
            "dispatch-different-metadata",
            "OpaqueSubclassError",
            "an op on arguments with different metadata",
            "The default rule got two arguments of the class whose metadata differ (compared with `==`).",
            "s + Sharded(torch.ones(2), s._mesh, 1)",
            "Make the metadata agree first, or register a rule for the op.",
            fixed="""
                s + Sharded(torch.ones(2), s._mesh, 0)
            """,
        ),
        _e(
            "dispatch-rule-type-error",
            "OpaqueSubclassError",
            "a rule that raises `TypeError`",
            """An op rule (registered, or the default one) raised `TypeError`. It leaves
            `__torch_dispatch__` as `OpaqueSubclassError`, with the `TypeError` chained, since torch's
            Python operators turn a `TypeError` into `NotImplemented` and would report only
            `unsupported operand type(s)`.""",
            """
            @Sharded.implements(torch.ops.aten.mul.Tensor)
            def mul(func, args, kwargs):
                a, b = args
                return Sharded(func(a._data, b), a._mesh)  # forgets _dim


            s * 2
            """,
            "Correct the rule where the chained traceback points (here: pass `_dim`, or use `a.wrap_like(...)`).",
            fixed="""
                @Sharded.implements(torch.ops.aten.mul.Tensor)
                def mul(func, args, kwargs):
                    a, b = args
                    return a.wrap_like(_data=func(a._data, b))


                s * 2
            """,
        ),
    ),
)

FLATTEN_NAMES = Group(
    "flatten-names",
    "What `__tensor_flatten__` returns: the attribute names",
    """`__tensor_flatten__` must return a pair `(attribute_names, context)`: a list (or tuple) of
    distinct attribute names, whose order fixes the flat slots, and any hashable context. The
    library calls it in one place (`opaque_subclass.core.walk.read_level`) and checks the result
    there, for `flatten_subclass`, `describe_args`, the run-time unwrap without metas, the
    parametrization, and under torch.compile and non-strict torch.export.""",
    "",
    (
        _e(
            "flatten-not-a-pair",
            "OpaqueTypeError",
            "not a pair",
            "`__tensor_flatten__` returned the names alone, or a tuple of another length.",
            """
            class NoContext(MeshTensor):
                def __tensor_flatten__(self):
                    return ["_data", "_mesh"]


            osc.flatten_subclass(NoContext(torch.ones(2), Mesh()))
            """,
            'Return the names and a context: `return ["_data", "_mesh"], self._tag` (`None` for no context).',
            fixed="""
                class NoContext(MeshTensor):
                    def __tensor_flatten__(self):
                        ctx = self._tag
                        {fix}


                osc.flatten_subclass(NoContext(torch.ones(2), Mesh()))
            """,
        ),
        _e(
            "flatten-names-not-a-list",
            "OpaqueTypeError",
            "names that are not a list or tuple",
            """The names are a set, a frozenset, a dict or a generator: a set has no order, and a
            generator is used up by its first reader.""",
            """
            class SetNames(MeshTensor):
                def __tensor_flatten__(self):
                    return {"_data", "_mesh"}, self._tag


            osc.flatten_subclass(SetNames(torch.ones(2), Mesh()))
            """,
            'Return a list: `["_data", "_mesh"]`.',
            fixed="""
                class SetNames(MeshTensor):
                    def __tensor_flatten__(self):
                        return ["_data", "_mesh"], self._tag


                osc.flatten_subclass(SetNames(torch.ones(2), Mesh()))
            """,
        ),
        _e(
            "flatten-names-not-strings",
            "OpaqueTypeError",
            "names that are not strings",
            """The names are a single string (`return ("_data"), ctx` is a string, not a tuple), or a
            list with an entry that is not a string.""",
            """
            class OneName(MeshTensor):
                def __tensor_flatten__(self):
                    return ("_data"), self._tag


            osc.flatten_subclass(OneName(torch.ones(2), Mesh()))
            """,
            'Return a list of strings: `["_data"]`, or `("_data",)`.',
            fixed="""
                class OneName(MeshTensor):
                    def __tensor_flatten__(self):
                        return ["_data", "_mesh"], self._tag


                osc.flatten_subclass(OneName(torch.ones(2), Mesh()))
            """,
        ),
        _e(
            "flatten-names-repeated",
            "OpaqueTypeError",
            "a name listed twice",
            "An attribute name appears more than once; each attribute takes one flat slot.",
            """
            class Twice(MeshTensor):
                def __tensor_flatten__(self):
                    return ["_data", "_mesh", "_mesh"], self._tag


            osc.flatten_subclass(Twice(torch.ones(2), Mesh()))
            """,
            "List each name once (the message gives the list without repeats).",
            fixed="""
                class Twice(MeshTensor):
                    def __tensor_flatten__(self):
                        return ['_data', '_mesh'], self._tag


                osc.flatten_subclass(Twice(torch.ones(2), Mesh()))
            """,
        ),
        _e(
            "flatten-missing-attribute",
            "OpaqueAttributeError",
            "a name the instance does not have",
            """A listed name is not an attribute of the instance: an attribute set only sometimes
            (or later), deleted, or a typo.""",
            """
            class Late(MeshTensor):
                def __tensor_flatten__(self):
                    return ["_data", "_mesh", "_scale"], self._tag

                @classmethod
                def __tensor_unflatten__(cls, inner, tag, outer_size, outer_stride):
                    out = cls(inner["_data"], inner["_mesh"], tag)
                    out._scale = inner["_scale"]
                    return out


            osc.flatten_subclass(Late(torch.ones(2), Mesh()))
            """,
            """Set the attribute before the instance is used (the message's statement, with `value`
            the tensor or registered opaque it should hold), or list only attributes that
            `__new__`/`__init__` set on every instance (for a typo: the right name).""",
            fixed="""
                class Late(MeshTensor):
                    def __tensor_flatten__(self):
                        return ["_data", "_mesh", "_scale"], self._tag

                    @classmethod
                    def __tensor_unflatten__(cls, inner, tag, outer_size, outer_stride):
                        out = cls(inner["_data"], inner["_mesh"], tag)
                        out._scale = inner["_scale"]
                        return out


                x = Late(torch.ones(2), Mesh())
                value = torch.ones(1)
                {fix}
                osc.flatten_subclass(x)
            """,
        ),
        _e(
            "flatten-no-tensor",
            "OpaqueTypeError",
            "no tensor among the names",
            """The names list no tensor attribute (only opaques, or nothing): torch builds a level's
            fake and functional copies from its inner tensors.""",
            """
            class OnlyMesh(MeshTensor):
                def __tensor_flatten__(self):
                    return ["_mesh"], self._tag


            osc.flatten_subclass(OnlyMesh(torch.ones(2), Mesh()))
            """,
            'Keep the data in a tensor attribute and list it first: `return ["_data", "_mesh"], ctx`.',
            fixed="""
                class OnlyMesh(MeshTensor):
                    def __tensor_flatten__(self):
                        {fix}


                osc.flatten_subclass(OnlyMesh(torch.ones(2), Mesh()))
            """,
        ),
    ),
)

FLATTEN_VALUES = Group(
    "flatten-values",
    "What `__tensor_flatten__` returns: the attribute values",
    """Every listed attribute must hold a tensor (plain, or a nested wrapper subclass) or a
    registered *reference* opaque. Anything else is refused with the subclass, the attribute's
    path from the argument (`x._data._mesh` for a nested level; `L['x']._mesh` under
    torch.compile), the type found and a fix.""",
    "",
    (
        _e(
            "value-unregistered",
            "OpaqueTypeError",
            "an object of an unregistered class",
            "The attribute holds an object whose class is not registered as an opaque (here at a nested level).",
            "osc.flatten_subclass(MeshTensor(MeshTensor(torch.ones(2), Handle()), Mesh()))",
            """Register the class as a reference opaque (the message gives the call), or, if the
            object is a constant, move it into the flatten context.""",
            fixed="""
                {fix}
                osc.flatten_subclass(MeshTensor(MeshTensor(torch.ones(2), Handle()), Mesh()))
            """,
        ),
        _e(
            "value-builtin",
            "OpaqueTypeError",
            "a builtin value or `None`",
            "The attribute holds an `int`, `str`, `None`, a list, a function or another builtin object.",
            'osc.flatten_subclass(MeshTensor(torch.ones(2), "dp"))',
            """Move the value into the flatten context (the second value `__tensor_flatten__`
            returns) and read it back in `__tensor_unflatten__`.""",
            fixed="""
                osc.flatten_subclass(MeshTensor(torch.ones(2), Mesh(), "dp"))
            """,
        ),
        _e(
            "value-torch-type",
            "OpaqueTypeError",
            "one of torch's own value types",
            "The attribute holds a `torch.dtype`, `torch.device`, `torch.Size`, a module or another value torch.compile handles itself.",
            "osc.flatten_subclass(MeshTensor(torch.ones(2), torch.float16))",
            "Move the value into the flatten context.",
            fixed="""
                osc.flatten_subclass(MeshTensor(torch.ones(2), Mesh(), torch.float16))
            """,
        ),
        _e(
            "value-value-opaque",
            "ValueOpaqueListedError",
            "a value opaque",
            """The attribute holds a registered *value* opaque: a constant that torch.compile compares
            and bakes in, which belongs in the context. `ValueOpaqueListedError` (in
            `opaque_subclass.core.walk`) is a `TypeError`; where torch's own check raises
            `ValueError` for this case, the backport raises this message as a `ValueError`.""",
            "osc.flatten_subclass(MeshTensor(torch.ones(2), Config(8)))",
            """Return the object in the context instead of the names; if its identity matters,
            register its class as a reference opaque (in a fresh process: the kind cannot change).""",
            fixed="""
                class InContext(MeshTensor):
                    def __tensor_flatten__(self):
                        names = ["_data"]
                        {fix}

                    @classmethod
                    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
                        return cls(inner["_data"], ctx[1])


                osc.flatten_subclass(InContext(torch.ones(2), Config(8)))
            """,
        ),
    ),
)

UNFLATTEN = Group(
    "unflatten",
    "What `__tensor_unflatten__` returns",
    """`__tensor_unflatten__(inner_tensors, context, outer_size, outer_stride)` must return an
    instance of its class with the shape and dtype of the instance that was flattened.""",
    "",
    (
        _e(
            "unflatten-other-type",
            "OpaqueTypeError",
            "an object of another type",
            """`__tensor_unflatten__` returned something other than an instance of its class (the
            inner tensor, a parent class, `None`). Checked wherever the library rebuilds a
            subclass: `unflatten_subclass`, `wrap_args`, the parametrization, and when
            torch.compile or torch.export first meets the input.""",
            """
            class ReturnsInner(MeshTensor):
                @classmethod
                def __tensor_unflatten__(cls, inner, tag, outer_size, outer_stride):
                    return inner["_data"]


            leaves, spec = osc.flatten_subclass(ReturnsInner(torch.ones(2), Mesh()))
            osc.unflatten_subclass(leaves, spec)
            """,
            "Return `cls(...)` built from the inner tensors, the context and `outer_size`/`outer_stride`.",
            fixed="""
                class ReturnsInner(MeshTensor):
                    @classmethod
                    def __tensor_unflatten__(cls, inner, tag, outer_size, outer_stride):
                        return ReturnsInner(inner["_data"], inner["_mesh"], tag)


                leaves, spec = osc.flatten_subclass(ReturnsInner(torch.ones(2), Mesh()))
                osc.unflatten_subclass(leaves, spec)
            """,
        ),
        _e(
            "unflatten-shape-dtype",
            "OpaqueTypeError",
            "another shape or dtype",
            """The rebuilt instance has another shape or dtype than the instance it was flattened
            from. torch.compile and non-strict torch.export check this when they first meet an
            input (torch.compile on the fake instance torch rebuilt, non-strict export by
            rebuilding each level with `opaque_subclass.core.checks.check_rebuild`, run directly
            here); `flatten_subclass`/`unflatten_subclass` do not compare them.""",
            """
            from opaque_subclass.core.checks import check_rebuild


            class DropsShape(MeshTensor):
                @classmethod
                def __tensor_unflatten__(cls, inner, tag, outer_size, outer_stride):
                    return cls(inner["_data"][:1], inner["_mesh"], tag)


            check_rebuild(DropsShape(torch.ones(2), Mesh()))
            """,
            """Build the result with `outer_size`, `outer_stride` and the inner tensors' dtype
            (`torch.Tensor._make_wrapper_subclass(cls, outer_size, strides=outer_stride,
            dtype=...)`).""",
            fixed="""
                class DropsShape(MeshTensor):
                    @classmethod
                    def __tensor_unflatten__(cls, inner, tag, outer_size, outer_stride):
                        return cls(inner["_data"], inner["_mesh"], tag)


                check_rebuild(DropsShape(torch.ones(2), Mesh()))
            """,
        ),
    ),
)

FLATTEN_API = Group(
    "flatten-api",
    "Calling `flatten_subclass`, `unflatten_subclass` and `describe_args`",
    "`unflatten_subclass` checks the leaf count and every leaf against its slot before rebuilding.",
    """
    leaves, spec = osc.flatten_subclass(x)  # [tensor, Mesh('dp')], a SubclassLayout
    """,
    (
        _e(
            "flatten-not-a-tensor",
            "OpaqueTypeError",
            "`flatten_subclass` of something that is not a tensor",
            "`flatten_subclass` takes one tensor (a subclass instance, or a plain tensor).",
            "osc.flatten_subclass(Mesh())",
            "Pass the subclass instance; for a list of arguments use `describe_args`.",
            fixed="""
                osc.flatten_subclass(x)
            """,
        ),
        _e(
            "unflatten-not-a-spec",
            "OpaqueTypeError",
            "`unflatten_subclass` without a spec",
            "The second argument is not a spec returned by `flatten_subclass` (nor a meta from `describe_args`).",
            'osc.unflatten_subclass(leaves, "MeshTensor")',
            "Pass the second value `flatten_subclass` returned.",
            fixed="""
                osc.unflatten_subclass(leaves, spec)
            """,
        ),
        _e(
            "unflatten-leaf-count",
            "OpaqueValueError",
            "the wrong number of leaves",
            "The leaves are more or fewer than the spec describes.",
            "osc.unflatten_subclass(leaves[:1], spec)",
            "Pass exactly the leaves `flatten_subclass` returned for this spec.",
            fixed="""
                osc.unflatten_subclass(leaves, spec)
            """,
        ),
        _e(
            "unflatten-tensor-for-opaque",
            "OpaqueTypeError",
            "a tensor (or another object) in an opaque slot",
            "A leaf in an opaque slot is not a reference opaque of the slot's type.",
            "osc.unflatten_subclass([leaves[0], torch.ones(2)], spec)",
            "Pass the leaves in the order `flatten_subclass` returned them.",
            fixed="""
                osc.unflatten_subclass(leaves, spec)
            """,
        ),
        _e(
            "unflatten-opaque-for-tensor",
            "OpaqueTypeError",
            "an opaque (or another object) in a tensor slot",
            "A leaf in a tensor slot is not a tensor.",
            "osc.unflatten_subclass([Mesh(), Mesh()], spec)",
            "Pass the leaves in the order `flatten_subclass` returned them.",
            fixed="""
                osc.unflatten_subclass(leaves, spec)
            """,
        ),
        _e(
            "unflatten-unregistered",
            "OpaqueTypeError",
            "an opaque whose class is not registered in this process",
            """The leaf in an opaque slot is of the slot's class, but that class is not registered in
            this process: a spec made where it was registered (another process, an unpickled spec,
            a spec built by hand) is used where it is not.""",
            """
            class Pipe:  # registered where the spec was made, not here
                pass


            pipe_spec = osc.SubclassLayout(
                flat_tensor_start_idx=0,
                attrs={"_data": osc.TensorSlot(0, "_data"), "_mesh": osc.OpaqueSlot(1, "_mesh", Pipe)},
                meta="t",
                outer_size=(2,),
                outer_stride=(1,),
                subclass_type=MeshTensor,
            )
            osc.unflatten_subclass([torch.ones(2), Pipe()], pipe_spec)
            """,
            "Register the class as a reference opaque in this process before rebuilding (the message gives the call).",
            fixed="""
                {fix}
                osc.unflatten_subclass([torch.ones(2), Pipe()], pipe_spec)
            """,
        ),
        _e(
            "create-meta-not-a-list",
            "OpaqueTypeError",
            "`describe_args` of a single tensor",
            "`describe_args` takes a list or tuple of arguments.",
            "osc.describe_args(x)",
            "Wrap a single argument in a list: `describe_args([x])`.",
            fixed="""
                osc.describe_args([x])
            """,
        ),
    ),
)

METAS = Group(
    "metas",
    "Building metas by hand: `SubclassLayout`",
    """`SubclassLayout` checks its fields when it is constructed, and its `attrs` cannot be
    changed afterwards (all metas are frozen dataclasses: assigning a field raises
    `dataclasses.FrozenInstanceError`, an `AttributeError`, from the standard library).""",
    """
    def scm(attrs, subclass_type=MeshTensor):
        return osc.SubclassLayout(
            flat_tensor_start_idx=0,
            attrs=attrs,
            meta="t",
            outer_size=(2,),
            outer_stride=(1,),
            subclass_type=subclass_type,
        )
    """,
    (
        _e(
            "meta-subclass-type",
            "OpaqueTypeError",
            "`subclass_type` is not a tensor subclass",
            "`subclass_type` is not a class derived from `torch.Tensor`.",
            'scm({"_data": osc.TensorSlot(0, "_data")}, subclass_type=Mesh)',
            "Pass the wrapper subclass (`MeshTensor`), not the class of one of its attributes.",
            fixed="""
                {fix}
                scm({"_data": osc.TensorSlot(0, "_data"), "_mesh": osc.OpaqueSlot(1, "_mesh", Mesh)}, subclass_type=type(x))
            """,
        ),
        _e(
            "meta-attrs-value",
            "OpaqueTypeError",
            "an `attrs` value that is not a meta",
            "A value of `attrs` is not a `TensorSlot`, `OpaqueSlot` or `SubclassLayout`.",
            'scm({"_data": 0})',
            'Describe each attribute with a meta: `{"_data": osc.TensorSlot(0, "_data")}`.',
            fixed="""
                from opaque_subclass import TensorSlot

                scm({"_data": {fix}})
            """,
        ),
        _e(
            "meta-attrs-key",
            "OpaqueValueError",
            "an `attrs` key that differs from its meta's `attr`",
            "The key of an `attrs` entry and the `attr` field of its meta name different attributes.",
            'scm({"_data": osc.TensorSlot(0, "data")})',
            'Use one name for both: `{"_data": osc.TensorSlot(0, "_data")}`.',
            fixed="""
                slot = osc.TensorSlot(0, "data")
                {fix}
                scm({"_data": slot})
            """,
        ),
        _e(
            "meta-slots",
            "OpaqueValueError",
            "slots that are not contiguous",
            "The attributes' flat slots do not follow each other from `flat_tensor_start_idx`, in order.",
            'scm({"_data": osc.TensorSlot(0, "_data"), "_mesh": osc.OpaqueSlot(2, "_mesh", Mesh)})',
            "Number the slots 0, 1, 2, ... in the order of `attrs` (a nested meta takes `arg_count` slots).",
            fixed="""
                scm({"_data": osc.TensorSlot(0, "_data"), "_mesh": osc.OpaqueSlot(1, "_mesh", Mesh)})
            """,
        ),
        _e(
            "meta-attrs-read-only",
            "OpaqueTypeError",
            "changing `attrs`",
            "`SubclassLayout.attrs` is a read-only mapping.",
            'spec.attrs["_extra"] = osc.TensorSlot(2, "_extra")',
            "Build a new meta with the attributes you want (or `describe_args` from an instance).",
            fixed="""
                meta = spec
                name, slot_meta = "_extra", osc.TensorSlot(2, "_extra")
                {fix}
            """,
        ),
    ),
)

RUNTIME = Group(
    "runtime",
    "Run-time wrap and unwrap",
    """`unwrap_args` turns subclass arguments into the flat list a graph sees, and
    `wrap_args` rebuilds them; given metas, both run generated straight-line code
    that checks each tensor slot.""",
    """
    metas = osc.describe_args([x])
    flat = osc.unwrap_args([x], is_joint_structure=False, subclass_metas=metas)
    """,
    (
        _e(
            "unwrap-not-a-list",
            "OpaqueTypeError",
            "arguments that are not a list",
            "`unwrap_args` got a single argument instead of a list or tuple of them.",
            "osc.unwrap_args(x, is_joint_structure=False)",
            "Pass `[x]`, or `is_joint_structure=True` with a `(primals, tangents)` pair.",
            fixed="""
                osc.unwrap_args([x], is_joint_structure=False)
            """,
        ),
        _e(
            "unwrap-joint-not-a-pair",
            "OpaqueTypeError",
            "a joint structure that is not a pair",
            """With `is_joint_structure=True` the arguments (and the metas) must be a pair
            `(primals, tangents)` of lists; the same for `wrap_args_maybe_joint`.""",
            "osc.unwrap_args([x], is_joint_structure=True)",
            "Pass `([primals...], [tangents...])`, or `is_joint_structure=False` for a flat list.",
            fixed="""
                osc.unwrap_args(([x], []), is_joint_structure=True)
            """,
        ),
        _e(
            "unwrap-meta-count",
            "OpaqueSubclassError",
            "metas for other arguments",
            "The number of metas differs from the number of arguments.",
            "osc.unwrap_args([x, x], is_joint_structure=False, subclass_metas=metas)",
            "Pass the metas made for exactly these arguments: `describe_args(args)`.",
            fixed="""
                args = [x, x]
                {fix}
                osc.unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
            """,
        ),
        _e(
            "unwrap-type",
            "OpaqueTypeError",
            "an argument of another type than its meta",
            "An argument is not of the subclass its meta was made from.",
            "osc.unwrap_args([torch.ones(2)], is_joint_structure=False, subclass_metas=metas)",
            "Re-create the metas for the new argument types (torch.compile recompiles on a type change).",
            fixed="""
                args = [torch.ones(2)]
                metas = osc.describe_args(args)
                osc.unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
            """,
        ),
        _e(
            "unwrap-tensor-slot",
            "OpaqueTypeError",
            "a non-tensor where the meta has a tensor",
            """An attribute that was a tensor when the metas were made holds something else now
            (`None`, a number).""",
            """
            y = MeshTensor(torch.ones(2), Mesh())
            y._data = None
            osc.unwrap_args([y], is_joint_structure=False, subclass_metas=metas)
            """,
            "Give the attribute a tensor, or re-create the metas from arguments of the new structure.",
            fixed="""
                y = MeshTensor(torch.ones(2), Mesh())
                osc.unwrap_args([y], is_joint_structure=False, subclass_metas=metas)
            """,
        ),
        _e(
            "wrap-width",
            "OpaqueSubclassError",
            "a flat list of another length than the metas",
            """The flat list has more or fewer values than the metas describe (with
            `num_fw_outs_saved_for_bw`, plus that many saved activations).""",
            "osc.wrap_args([*flat, torch.ones(1)], subclass_metas=metas, is_runtime=True)",
            """Wrap the flat list made from the same subclass structure as the metas; re-create the
            metas (`describe_args`) if `__tensor_flatten__` changed.""",
            fixed="""
                args = [x]
                {fix}
                osc.wrap_args(flat, subclass_metas=metas, is_runtime=True)
            """,
        ),
        _e(
            "wrap-tensor-slot",
            "OpaqueTypeError",
            "a non-tensor in a tensor slot of the flat list",
            "A value of the flat list in a slot that rebuilds a tensor attribute is not a tensor.",
            "osc.wrap_args([None, flat[1]], subclass_metas=metas, is_runtime=True)",
            "Pass the flat values in the order `unwrap_args` returns them.",
            fixed="""
                osc.wrap_args(flat, subclass_metas=metas, is_runtime=True)
            """,
        ),
        _e(
            "wrap-joint-no-tangent-metas",
            "OpaqueValueError",
            "a joint wrap without tangent metas",
            "`wrap_args_maybe_joint(..., is_joint_structure=True)` was not given `tangent_metas`.",
            "osc.wrap_args_maybe_joint((flat, flat), is_joint_structure=True, inp_metas=metas)",
            "Pass `tangent_metas=describe_args(tangents)`.",
            fixed="""
                osc.wrap_args_maybe_joint(
                    (flat, flat), is_joint_structure=True, inp_metas=metas, tangent_metas=osc.describe_args([x])
                )
            """,
        ),
    ),
)

TANGENTS = Group(
    "tangents",
    "Tangents: `unwrap_tangent`",
    """`unwrap_tangent(tangent, meta)` brings a gradient given at run time to the type,
    context and layout of its forward output (`meta`) and returns its leaves.""",
    """
    (out_meta,) = osc.describe_args([x])  # the forward output was x
    (mesh_meta,) = osc.describe_args([Mesh()])  # an output that was an opaque
    """,
    (
        _e(
            "tangent-for-opaque",
            "OpaqueTypeError",
            "a tensor for an output that was an opaque",
            "The forward output in this slot was an opaque, which has no gradient.",
            "osc.unwrap_tangent(torch.ones(1), mesh_meta)",
            "Pass `None` for outputs that are opaques.",
            fixed="""
                osc.unwrap_tangent(None, mesh_meta)
            """,
        ),
        _e(
            "tangent-metadata",
            "OpaqueTypeError",
            "another subclass type or context, and no coercion",
            """The tangent's type or flatten context differs from the forward output's, and its class
            defines no `__coerce_same_metadata_as_tangent__`.""",
            'osc.unwrap_tangent(MeshTensor(torch.ones(2), Mesh(), "other"), out_meta, name="grad_out[0]")',
            """Define `__coerce_same_metadata_as_tangent__(self, expected_metadata,
            expected_type=None)` returning a tangent of the expected type and context, or make
            backward produce one.""",
            fixed="""
                MeshTensor.__coerce_same_metadata_as_tangent__ = lambda self, expected_metadata, expected_type=None: MeshTensor(
                    self._data, self._mesh, expected_metadata
                )
                osc.unwrap_tangent(MeshTensor(torch.ones(2), Mesh(), "other"), out_meta, name="grad_out[0]")
            """,
        ),
        _e(
            "tangent-coercion",
            "OpaqueTypeError",
            "a coercion that returns the wrong type",
            "`__coerce_same_metadata_as_tangent__` returned something other than the expected type.",
            """
            class Coerces(MeshTensor):
                def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
                    return self._data  # a plain tensor, not a MeshTensor


            osc.unwrap_tangent(Coerces(torch.ones(2), Mesh()), out_meta)
            """,
            "Return a tensor of the expected type and flatten context.",
            fixed="""
                class Coerces(MeshTensor):
                    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
                        return MeshTensor(self._data, self._mesh, expected_metadata)


                osc.unwrap_tangent(Coerces(torch.ones(2), Mesh()), out_meta)
            """,
        ),
        _e(
            "tangent-opaque-slot",
            "OpaqueTypeError",
            "a tangent without the output's opaque",
            "An attribute that held a reference opaque in the forward output holds something else in the tangent.",
            """
            grad = MeshTensor(torch.ones(2), Mesh())
            grad._mesh = None
            osc.unwrap_tangent(grad, out_meta)
            """,
            "Build the tangent with the same attributes as the forward output (its opaques included).",
            fixed="""
                osc.unwrap_tangent(MeshTensor(torch.ones(2), Mesh()), out_meta)
            """,
        ),
    ),
)

MODULES = Group(
    "modules",
    "Modules: storages and parameters",
    """`untyped_storages` counts a tensor's memory; `unwrap_subclass_parameters`
    parametrizes every subclass parameter of a module over its plain leaves with
    `opaque_subclass.modules.parametrization.UnwrapSubclass`.""",
    """
    from opaque_subclass.modules.parametrization import UnwrapSubclass


    class Holder(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.w = torch.nn.Parameter(w, requires_grad=False)

        def forward(self, inp):
            return self.w * inp
    """,
    (
        _e(
            "storages-not-a-tensor",
            "OpaqueTypeError",
            "`untyped_storages` of something that is not a tensor",
            "`untyped_storages` takes one tensor.",
            "osc.untyped_storages([x])",
            "Pass the tensor (or subclass instance) itself.",
            fixed="""
                osc.untyped_storages(x)
            """,
        ),
        _e(
            "parametrization-unregistered",
            "OpaqueSubclassError",
            "`UnwrapSubclass` used before `right_inverse`",
            """An `UnwrapSubclass` was called directly, or registered without `unsafe=True`, so torch
            never ran its `right_inverse`.""",
            "UnwrapSubclass()(torch.ones(2))",
            """Register it with `torch.nn.utils.parametrize.register_parametrization(module, name,
            UnwrapSubclass(), unsafe=True)`, or call `osc.unwrap_subclass_parameters(module)`.""",
            fixed="""
                module = Holder(MeshTensor(torch.ones(2), Mesh()))
                {fix}
                module.w
            """,
        ),
        _e(
            "parametrization-not-a-subclass",
            "OpaqueTypeError",
            "`UnwrapSubclass` on a plain tensor",
            "`UnwrapSubclass` was registered on a parameter that is not a wrapper subclass.",
            "UnwrapSubclass().right_inverse(torch.ones(2))",
            "Parametrize only subclass parameters; `unwrap_subclass_parameters` picks them.",
            fixed="""
                module = Holder(MeshTensor(torch.ones(2), Mesh()))
                osc.unwrap_subclass_parameters(module).w
            """,
        ),
        _e(
            "parametrization-deleted-leaf",
            "OpaqueSubclassError",
            "an opaque leaf deleted from a parametrization",
            """After `unwrap_subclass_parameters` (or torch's `unwrap_tensor_subclass_parameters`), an opaque leaf
            stored on `module.parametrizations.w` was deleted, and `module.w` was read (also by a
            forward, compiled or not). Raised from the library's fix of torch's
            `ParametrizationList.forward` on every release; not an `AttributeError`, which the
            property `w` would turn into `'Holder' object has no attribute 'w'`.""",
            """
            module = osc.unwrap_subclass_parameters(Holder(MeshTensor(torch.ones(2), Mesh())))
            del module.parametrizations.w.original1
            module.w
            """,
            """Store the opaque again at the leaf the message names (assigning `module.w` needs every
            leaf in place: torch's `right_inverse` reads them).""",
            fixed="""
                module = osc.unwrap_subclass_parameters(Holder(MeshTensor(torch.ones(2), Mesh())))
                del module.parametrizations.w.original1
                value = Mesh()
                {fix}
                assert module.w._mesh is value
            """,
        ),
        _e(
            "parametrization-export",
            "OpaqueSubclassError",
            "exporting a parametrized subclass torch cannot rebuild",
            """`torch.export` traced a module after `unwrap_subclass_parameters`, and a subclass
            it rebuilds has a constructor torch.export cannot record (its `__init__` is not marked
            with `mark_subclass_constructor_exportable_experimental`; an `OpaqueSubclass`'s is).
            Raised while exporting.""",
            """
            holder = osc.unwrap_subclass_parameters(Holder(MeshTensor(torch.ones(2), Mesh())))
            torch.export.export(holder, (torch.ones(2),), strict=False)
            """,
            """Export the subclass parameter itself (remove the parametrization, as the message
            shows), or derive the subclass from `OpaqueSubclass`, whose constructor is recorded.""",
            fixed="""
                # A fresh module: torch 2.11's non-strict export leaves a buffer hook on the
                # module of a failed export (not removed on error), which refuses buffers later.
                module = osc.unwrap_subclass_parameters(Holder(MeshTensor(torch.ones(2), Mesh())))
                {fix}
                torch.export.export(module, (torch.ones(2),), strict=False)
            """,
        ),
    ),
)

EXPORT = Group(
    "export",
    "Saving and loading exported programs: `opaque_subclass.export`",
    """`opaque_subclass.export.save` stores each reference opaque of a program by name;
    `opaque_subclass.export.load` binds every name to an object of the loading process. The set-up
    exports a small model whose two parameters share one mesh (named `w._mesh`), the same with two
    meshes, and a plain `Linear`.""",
    '''
    class Weight(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}


    class Model(torch.nn.Module):
        def __init__(self, mesh, other=None):
            super().__init__()
            self.w = torch.nn.Parameter(Weight(torch.ones(2), mesh), requires_grad=False)
            self.v = torch.nn.Parameter(Weight(torch.ones(2), other if other is not None else mesh), requires_grad=False)

        def forward(self, inp):
            return self.w * inp, self.v * inp


    mesh, tp = Mesh("dp"), Mesh("tp")
    ep = torch.export.export(Model(mesh), (torch.ones(2),), strict=False)
    two_meshes = torch.export.export(Model(mesh, tp), (torch.ones(2),), strict=False)
    buffer = io.BytesIO()
    osc.export.save(ep, buffer)
    saved = buffer.getvalue()  # needs the name 'w._mesh'

    linear = torch.export.export(torch.nn.Linear(2, 2), (torch.ones(2),), strict=False)


    def torch_saved(program, **extra_files):
        """``program`` saved by torch.export.save, as bytes."""
        out = io.BytesIO()
        torch.export.save(program, out, extra_files=extra_files)
        return out.getvalue()
    ''',
    (
        _e(
            "save-not-a-program",
            "OpaqueTypeError",
            "`save` of something that is not an exported program",
            "`save` takes a `torch.export.ExportedProgram`.",
            "osc.export.save(Model(mesh), io.BytesIO())",
            "Export first: `osc.export.save(torch.export.export(model, args), f)`.",
            fixed="""
                osc.export.save(torch.export.export(Model(mesh), (torch.ones(2),), strict=False), io.BytesIO())
            """,
        ),
        _e(
            "save-reserved-file",
            "OpaqueValueError",
            "an extra file with the manifest's name",
            "`extra_files` has an entry named `opaque_subclass.json`, the name of the manifest `save` writes.",
            'osc.export.save(ep, io.BytesIO(), extra_files={"opaque_subclass.json": "{}"})',
            "Rename that extra file.",
            fixed="""
                osc.export.save(ep, io.BytesIO(), extra_files={"notes.json": "{}"})
            """,
        ),
        _e(
            "save-name-not-a-string",
            "OpaqueTypeError",
            "an opaque name that is not a string",
            "A key of `opaques=` is not a non-empty string (here the mapping is the wrong way round).",
            'osc.export.save(ep, io.BytesIO(), opaques={mesh: "dp"})',
            'Map names to objects: `opaques={"dp": mesh}`.',
            fixed="""
                osc.export.save(ep, io.BytesIO(), opaques={"dp": mesh})
            """,
        ),
        _e(
            "save-two-names",
            "OpaqueValueError",
            "one object under two names",
            "`opaques=` names the same object twice.",
            'osc.export.save(ep, io.BytesIO(), opaques={"dp": mesh, "data_parallel": mesh})',
            "Give each object one name.",
            fixed="""
                osc.export.save(ep, io.BytesIO(), opaques={"dp": mesh})
            """,
        ),
        _e(
            "save-name-clash",
            "OpaqueValueError",
            "one name for two objects",
            """A name given in `opaques=` is also the default name of another object of the program
            (an unnamed object is named after the first place that holds it).""",
            'osc.export.save(two_meshes, io.BytesIO(), opaques={"w._mesh": tp})',
            'Name both objects: `opaques={"dp": mesh, "tp": tp}`.',
            fixed="""
                osc.export.save(two_meshes, io.BytesIO(), opaques={"first": mesh, "second": tp})
            """,
        ),
        _e(
            "save-unused-name",
            "OpaqueValueError",
            "a name for an object the program does not hold",
            "`opaques=` names an object that is not in the program (the message lists those it holds).",
            'osc.export.save(ep, io.BytesIO(), opaques={"tp": tp})',
            "Name only objects of the program, or drop those names.",
            fixed="""
                osc.export.save(ep, io.BytesIO())
            """,
        ),
        _e(
            "load-missing",
            "OpaqueBindingError",
            "`load` without an object for a name",
            """The program holds reference opaques, saved by name, and `opaques=` has no object for
            one of them. `OpaqueBindingError` (in `opaque_subclass.export`) is an
            `OpaqueSubclassError` and a `LookupError`.""",
            "osc.export.load(io.BytesIO(saved))",
            """Pass this process's objects, `osc.export.load(f, opaques={"w._mesh": mesh})`, or a
            resolver `opaques=lambda name, cls: ...`; `osc.export.read_manifest(f)` lists the
            names.""",
            fixed="""
                osc.export.load(io.BytesIO(saved), opaques={"w._mesh": mesh})
            """,
        ),
        _e(
            "load-wrong-type",
            "OpaqueTypeError",
            "`load` with an object of the wrong type",
            """An object given for a name is not an instance of the type saved for it (or its class is
            registered as a value opaque in this process).""",
            'osc.export.load(io.BytesIO(saved), opaques={"w._mesh": Handle()})',
            "Pass an object of the saved type for each name.",
            fixed="""
                osc.export.load(io.BytesIO(saved), opaques={"w._mesh": mesh})
            """,
        ),
        _e(
            "load-unknown-name",
            "OpaqueBindingError",
            "`load` with a name the program does not have",
            "`opaques=` has a name that is not in the program's manifest.",
            'osc.export.load(io.BytesIO(saved), opaques={"w._mesh": mesh, "tp": tp})',
            "Drop the extra names; the message lists the ones the program needs.",
            fixed="""
                osc.export.load(io.BytesIO(saved), opaques={"w._mesh": mesh})
            """,
        ),
        _e(
            "load-not-saved-by-the-library",
            "OpaqueBindingError",
            "`opaques=` for a program `torch.export.save` wrote",
            "The archive has no manifest (it was not written by `opaque_subclass.export.save`), so it binds no opaques.",
            'osc.export.load(io.BytesIO(torch_saved(linear)), opaques={"w._mesh": mesh})',
            "Load it without `opaques=`.",
            fixed="""
                osc.export.load(io.BytesIO(torch_saved(linear)))
            """,
        ),
        _e(
            "load-foreign-manifest",
            "OpaqueValueError",
            "an archive whose manifest is not the library's",
            "The archive has an extra file named `opaque_subclass.json` that is not a manifest written by `save`.",
            'osc.export.load(io.BytesIO(torch_saved(linear, **{"opaque_subclass.json": "{}"})))',
            "Load it with `torch.export.load`, or save the program again with `opaque_subclass.export.save`.",
            fixed="""
                torch.export.load(io.BytesIO(torch_saved(linear, **{"opaque_subclass.json": "{}"})))
            """,
        ),
        _e(
            "load-newer-manifest",
            "OpaqueSubclassError",
            "an archive saved by a newer release of the library",
            "The manifest has a version this release cannot read.",
            """
            newer = '{"format": "opaque-subclass/export", "version": 99}'
            osc.export.load(io.BytesIO(torch_saved(linear, **{"opaque_subclass.json": newer})))
            """,
            "Upgrade opaque-subclass (`python -m pip install -U opaque-subclass`).",
        ),
        _e(
            "load-placeholder",
            "OpaqueSubclassError",
            "a program saved by `save` and loaded by `torch.export.load`",
            """`torch.export.load` loaded an archive that `opaque_subclass.export.save` wrote: its
            subclass parameters are placeholders without their opaques, and any op on one raises.""",
            'torch.export.load(io.BytesIO(saved)).state_dict["w"] * 2',
            """Load it with `osc.export.load(f, opaques={"w._mesh": mesh})`: the message gives the
            call with the names this tensor needs.""",
            fixed="""
                import opaque_subclass

                f = io.BytesIO(saved)
                program = {fix}
                program.state_dict["w"] * 2
            """,
        ),
        _e(
            "save-local-class",
            "OpaqueSubclassError",
            "saving a construction of a class defined in a function",
            """After `unwrap_subclass_parameters`, the exported graph constructs each subclass
            parameter, and the manifest records its class by qualified name; a class defined in a
            function cannot be imported by a loading process.""",
            """
            def local_weight():
                class LocalWeight(OpaqueSubclass):
                    tensor_attrs = ("_data",)
                    opaque_attrs = {"_mesh": Mesh}

                return LocalWeight(torch.ones(2), mesh)


            unwrapped = osc.unwrap_subclass_parameters(Holder(local_weight()))
            osc.export.save(torch.export.export(unwrapped, (torch.ones(2),), strict=False), io.BytesIO())
            """,
            "Define the subclass at module level, so that `import` finds it.",
        ),
        _e(
            "load-construction",
            "OpaqueSubclassError",
            "a saved construction run without being restored",
            """A program exported after `unwrap_subclass_parameters` and saved by
            `opaque_subclass.export.save` was loaded with `torch.export.load` and run: the library's
            stand-in for each subclass construction raises.""",
            """
            unwrapped = osc.unwrap_subclass_parameters(Holder(Weight(torch.ones(2), mesh)))
            constructs = io.BytesIO()
            osc.export.save(torch.export.export(unwrapped, (torch.ones(2),), strict=False), constructs)
            torch.export.load(io.BytesIO(constructs.getvalue())).module()(torch.ones(2))
            """,
            """Load it with `osc.export.load(f, opaques=objects)`, `objects` holding an object for
            each name the manifest lists (`osc.export.read_manifest(f).opaques`).""",
            fixed="""
                import opaque_subclass

                f = io.BytesIO(constructs.getvalue())
                objects = {"w._mesh": mesh}
                {fix}.module()(torch.ones(2))
            """,
        ),
    ),
)

MEMBERS = Group(
    "members",
    "Members of opaques in compiled code",
    """Compiled code may use the members an opaque's registration declares
    (`register_opaque(cls, members={name: osc.Member.USE_REAL | osc.Member.INLINED})`). The entry
    below compiles (`aot_eager`): the library's error reaches the caller as itself (Dynamo appends
    the user's line after the message shown).""",
    """
    class Gauge(OpaqueBase):
        def __init__(self, factor):
            self._factor = factor

        def factor(self):
            return self._factor


    osc.register_opaque(Gauge)  # no members declared


    class GaugeTensor(MeshTensor):
        pass
    """,
    (
        _e(
            "member-undeclared",
            "OpaqueMemberError",
            "a member the registration does not declare",
            """Compiled code reads or calls a member of a reference opaque that its registration's
            `members` does not name: torch.compile cannot tell whether to evaluate it on the real
            object (and guard the value) or trace it. The message names the class, the member, the
            path of the object (`L['t']._mesh`), the line of the compiled code and the fix.""",
            """
            def scaled(t):
                return t * t._mesh.factor()


            torch.compile(scaled, backend="aot_eager", fullgraph=True)(GaugeTensor(torch.ones(1), Gauge(2)))
            """,
            """Declare the member in the class's first registration. A class torch registers itself
            (`ProcessGroup`, `DeviceMesh`) cannot be changed: read the value outside the compiled
            function and pass it in.""",
            fixed="""
                def fixed():  # a class of its own name, as in a fresh process
                    class Gauge(OpaqueBase):
                        def __init__(self, factor):
                            self._factor = factor

                        def factor(self):
                            return self._factor

                    {fix}
                    torch._dynamo.reset()
                    out = torch.compile(lambda t: t * t._mesh.factor(), backend="aot_eager", fullgraph=True)(
                        GaugeTensor(torch.ones(1), Gauge(2))
                    )
                    assert out._data.tolist() == [2.0]


                fixed()
                """,
        ),
    ),
)

ADOPTING = Group(
    "adopting",
    "Adopting a class you do not own: `adopt`",
    """`osc.adopt(cls, {name: osc.ContextOpaque(path, opaque_cls)}, example=...)` makes the object at
    `path` of `cls`'s flatten context the opaque attribute `name` of `cls`
    ([adopting.md](adopting.md)). The declaration is checked when `adopt` runs (the paths on
    `example`'s context when it is given, otherwise on the first flatten); the adopted
    `__tensor_unflatten__` checks what it is given.""",
    """
    import dataclasses


    @dataclasses.dataclass(frozen=True)
    class Spec:
        mesh: Mesh
        dim: int


    class Vendor(torch.Tensor):
        # another package's class: its mesh in a spec, in the flatten context

        @staticmethod
        def __new__(cls, data, spec):
            t = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype)
            t._data, t._spec = data, spec
            return t

        def __repr__(self):
            return f"Vendor({self._spec})"

        def __tensor_flatten__(self):
            return ["_data"], (self._spec, False)

        @classmethod
        def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
            return cls(inner["_data"], ctx[0])

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            spec = next(a._spec for a in args if isinstance(a, cls))
            out = func(*tree_map_only(cls, lambda t: t._data, args), **(kwargs or {}))
            return tree_map_only(torch.Tensor, lambda t: cls(t, spec), out)


    v = Vendor(torch.ones(2), Spec(Mesh(), 0))
    """,
    (
        _e(
            "adopt-not-a-subclass",
            "OpaqueTypeError",
            "not a tensor subclass",
            "`adopt` was given something other than a tensor subclass with a flatten protocol (here an instance).",
            'osc.adopt(v, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)})',
            "Pass the class (`type(v)`).",
            fixed="""
                with osc.adopt(type(v), {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                    pass
            """,
        ),
        _e(
            "adopt-declaration",
            "OpaqueTypeError",
            "a path without its class",
            "A declaration is not an `osc.ContextOpaque(path, cls)` (here the path alone).",
            'osc.adopt(Vendor, {"_mesh": "[0].mesh"})',
            'Wrap it: `osc.ContextOpaque("[0].mesh", Mesh)`, with the class of the object at the path.',
            fixed="""
                with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                    pass
            """,
        ),
        _e(
            "adopt-name",
            "OpaqueValueError",
            "an attribute name that is taken",
            """The attribute name is not an identifier, shadows a `torch.Tensor` attribute, is an
            attribute of the class already, or shares its path with another declaration.""",
            'osc.adopt(Vendor, {"data": osc.ContextOpaque("[0].mesh", Mesh)})',
            "Choose a name of its own, as the message suggests.",
            fixed="""
                with osc.adopt(Vendor, {"_adopted_data": osc.ContextOpaque("[0].mesh", Mesh)}):
                    pass
            """,
        ),
        _e(
            "adopt-path-syntax",
            "OpaqueValueError",
            "not a path",
            """The path is not written in the notation of a context path: `.attribute`, `[index]` and
            `['key']` steps.""",
            'osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0]..mesh", Mesh)})',
            "Write the path as lint OSC001 writes it after `<context>`.",
            fixed="""
                {fix}
                osc.unadopt(Vendor)
            """,
        ),
        _e(
            "adopt-unregistered",
            "OpaqueTypeError",
            "a class that is not a reference opaque",
            """The declared class is not a registered reference opaque (an adopted object becomes a graph
            input passed by identity), or it is a value torch.compile compares, which stays in the
            context.""",
            'osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Handle)})',
            "Register the class (`osc.register_opaque`); leave values out of the declaration.",
            fixed="""
                {fix}
                with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                    pass
            """,
        ),
        _e(
            "adopt-value",
            "OpaqueTypeError",
            "a value in the declaration",
            "The declared class is a value type (here `int`): it stays in the context, guarded by equality.",
            'osc.adopt(Vendor, {"_dim": osc.ContextOpaque("[0].dim", int)})',
            "Drop it from the declaration.",
            fixed="""
                with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                    pass
            """,
        ),
        _e(
            "adopt-path-not-found",
            "OpaqueAttributeError",
            "a path that leads nowhere",
            """`example`'s context has nothing at the path (without `example`, the first flatten raises
            the same). The message names what the path found where it stopped, and suggests the path
            of an object of the declared class.""",
            'osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].meshes", Mesh)}, example=v)',
            "Use the suggested path (lint OSC001 reports it too).",
            fixed="""
                {fix}
                osc.unadopt(Vendor)
            """,
        ),
        _e(
            "adopt-wrong-type",
            "OpaqueTypeError",
            "another class at the path",
            "The object at the path of `example`'s context is not of the declared class.",
            'osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].dim", Mesh)}, example=v)',
            "Use the suggested path, or declare the class of the object there.",
            fixed="""
                {fix}
                osc.unadopt(Vendor)
            """,
        ),
        _e(
            "adopt-example",
            "OpaqueTypeError",
            "an example of another class",
            "`example` is not an instance of the class adopted.",
            'osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}, example=x)',
            "Pass an instance of the class, or no example.",
            fixed="""
                with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}, example=v):
                    pass
            """,
        ),
        _e(
            "adopt-twice",
            "OpaqueValueError",
            "adopted already",
            """The class is adopted already with another declaration (the same declaration again returns
            the adoption in force).""",
            """
            with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                osc.adopt(Vendor, {"_m": osc.ContextOpaque("[0].mesh", Mesh)})
            """,
            "Undo the first adoption, then adopt again.",
            fixed="""
                osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)})
                {fix}
                osc.adopt(Vendor, {"_m": osc.ContextOpaque("[0].mesh", Mesh)}).undo()
            """,
        ),
        _e(
            "adopted-unflatten-missing",
            "OpaqueSubclassError",
            "an unflatten with neither the object nor a context holding it",
            """The adopted class's `__tensor_unflatten__` was called without the adopted attribute and
            with a context from an adopted flatten (the placeholder where the object was). Code written
            for the class's own flatten does this when it rebuilds from a context torch recorded.""",
            """
            with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                Vendor.__tensor_unflatten__({"_data": v._data}, v.__tensor_flatten__()[1], v.shape, v.stride())
            """,
            "Pass the object, or a context that holds it.",
            fixed="""
                with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                    inner = {"_data": v._data, "_mesh": v._mesh}
                    Vendor.__tensor_unflatten__(inner, v.__tensor_flatten__()[1], v.shape, v.stride())
            """,
        ),
        _e(
            "adopted-unflatten-type",
            "OpaqueTypeError",
            "an unflatten given another object for the adopted attribute",
            "The adopted `__tensor_unflatten__` got an object of another class for the adopted attribute.",
            """
            with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                inner = {"_data": v._data, "_mesh": torch.zeros(0)}
                Vendor.__tensor_unflatten__(inner, v.__tensor_flatten__()[1], v.shape, v.stride())
            """,
            "Pass the object itself.",
            fixed="""
                with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                    inner = {"_data": v._data, "_mesh": v._mesh}
                    Vendor.__tensor_unflatten__(inner, v.__tensor_flatten__()[1], v.shape, v.stride())
            """,
        ),
        _e(
            "adopted-set",
            "OpaqueAttributeError",
            "setting the adopted attribute",
            "The adopted attribute was assigned; it is read from the instance's context.",
            """
            with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                v._mesh = Mesh("other")
            """,
            "Build a new instance whose context holds the object.",
            fixed="""
                with osc.adopt(Vendor, {"_mesh": osc.ContextOpaque("[0].mesh", Mesh)}):
                    w = Vendor(v._data, Spec(Mesh("other"), 0))
                    assert w._mesh.name == "other"
            """,
        ),
    ),
)

GROUPS: tuple[Group, ...] = (
    REGISTRATION,
    MEMBERS,
    DECLARING,
    CONSTRUCTING,
    FLATTEN_NAMES,
    FLATTEN_VALUES,
    UNFLATTEN,
    FLATTEN_API,
    METAS,
    RUNTIME,
    TANGENTS,
    MODULES,
    EXPORT,
    ADOPTING,
)

#: Entries without a ``fixed`` variant -> why their fix cannot be run here.
#: tests/test_errors_page.py checks that this is exactly the entries without one.
NOT_FIXED: dict[str, str] = {
    "load-newer-manifest": "the fix upgrades the installed package (pip install -U), outside this process",
    "save-local-class": "the fix moves the class into a module file that a loading process imports; "
    "the message's backticked `import` is a word, not a snippet",
}

#: Errors of opaque_subclass/{core,authoring,modules,export} that have no entry:
#: (where, exception type, why).
LEFT_OUT: tuple[tuple[str, str, str], ...] = (
    (
        "`fixes/traced_opaques.py` (`PythonKeyTracer.create_arg`)",
        "OpaqueCreatedWhileTracingError (an OpaqueValueError)",
        "a reference opaque made while torch traces (in a subclass's `__torch_dispatch__` or a fake "
        "kernel) and used by the graph, which torch would compile in as a constant every call shares "
        "(pytorch/pytorch#176044): raised only while AOTAutograd or torch.export traces, which this "
        "page does not run. The message names the class, the bug and the fix (create the object "
        "outside the compiled function and pass it in, or register an immutable class as a value "
        "opaque); tests/test_upstream_bugs.py shows it, docs/compatibility.md lists the bug.",
    ),
    (
        "`core/checks.py` (`check_guardable_context`)",
        "OpaqueTypeError",
        "a flatten context not equal to its own deep copy (an object compared by identity in it): "
        "raised only where Dynamo meets a subclass input under `torch.compile`, which this page does "
        "not run. The message names the subclass, the object's path in the context "
        "(`<context>[1]`), its type and the fix (list a registered opaque among the attributes, or "
        "give the class value equality); tests/test_errors.py shows it under aot_eager and inductor.",
    ),
    (
        "`core/registry.py` (`_api`)",
        "RuntimeError",
        "`register_opaque` on a torch without opaque objects (before 2.11): only on an unsupported "
        "torch, where `import opaque_subclass` already warns.",
    ),
    (
        "`releases/schema.py` (`enter_in_tables`, called by `register_opaque`)",
        "RuntimeError",
        "registering a class that does not inherit `OpaqueBase` on a torch build whose registry entry "
        "has fields the library does not know: not reachable on the tested releases.",
    ),
    (
        "`authoring/base.py` (`_register_pending`)",
        "OpaqueTypeError",
        "the first instance of a class declared with `register_opaques=True` built inside "
        "`torch.compile`: needs a compilation, which this page does not run. The message names the "
        "classes and gives the `register_opaque` calls to run before compiling.",
    ),
    (
        "`core/codegen.py` (`_bad_count`)",
        "OpaqueTypeError",
        "a compiled graph's generated unwrap called with another number of arguments (torch 2.11 "
        "backport): torch's guards never let that happen.",
    ),
    (
        "`export/archive.py` (`load`)",
        "OpaqueSubclassError",
        "torch cannot load an archive saved with another torch release: needs an archive from another release.",
    ),
    (
        "`export/_stored.py`, `export/_constructions.py` (`decode`)",
        "OpaqueSubclassError",
        "an archive written by a newer opaque-subclass (payload format, structure node or construction "
        "argument kind this release does not know), or whose construction records do not match its "
        "graph: need an archive from a future release or an edited one.",
    ),
    (
        "`export/_constructions.py` (`encode`)",
        "OpaqueSubclassError",
        "saving a program whose graph constructs a subclass from a symbolic value, an unpicklable "
        "constant or an argument structure torch cannot serialize: these depend on what the torch "
        "release records in the graph.",
    ),
    (
        "`adoption/presets.py` (`physicsnemo_shard_tensor`)",
        "OpaqueValueError",
        "the installed nvidia-physicsnemo is not a release the preset was written against (2.2.x): needs "
        "another release of that package installed. The message names the installed version and gives the "
        "declaration to adopt the class by hand. `adopt` called inside `torch.compile` "
        "(`adopt_while_compiling`, an `OpaqueTypeError`) needs a compilation.",
    ),
    (
        "everywhere",
        "AssertionError",
        "internal invariants (an unexpected meta, a graph copy out of step): a bug in the library, to be reported.",
    ),
)

#: Raise sites not listed separately: they raise the message of an entry.
SAME_MESSAGE = (
    "`__tensor_unflatten__` returning another type is checked by `unflatten_subclass`, the run-time "
    "`wrap_args`, the parametrization and `check_rebuild`, all with the message of "
    "[another type](#unflatten-other-type)",
    "`wrap_args_maybe_joint` with a joint structure that is not a pair raises the "
    "message of [unwrap](#unwrap-joint-not-a-pair) with its own name",
    "a flat list too short for `num_fw_outs_saved_for_bw` saved activations raises the message of "
    "[a flat list of another length](#wrap-width)",
    "`OpaqueSubclass` checks a tensor class and a plain value type in `opaque_attrs` twice (the "
    "second check cannot fire); one entry each",
    "the manifest reader's own `ValueError`s are raised as [a foreign manifest](#load-foreign-manifest), "
    "and bare `raise` statements re-raise an error unchanged",
)

# ---------------------------------------------------------------------- running them


@dataclass(frozen=True)
class Result:
    entry: Entry
    error: str  # the type raised
    message: str
    raised_in: str  # the library file that raised it, relative to the repository


def _library_dir() -> str:
    import opaque_subclass

    return os.path.dirname(os.path.abspath(opaque_subclass.__file__)) + os.sep


def _raised_in(e: BaseException, library: str) -> str | None:
    """The library file whose code raised ``e`` (the innermost frame), or ``None``."""
    tb = e.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if not filename.startswith(library):
        return None
    return "opaque_subclass/" + filename[len(library) :].replace(os.sep, "/")


def run() -> list[tuple[Group, list[Result]]]:
    """Run every trigger in a fresh ``__main__`` module; stop on a trigger that
    does not raise the library's error of its entry."""
    library = _library_dir()
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = __builtins__
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = module  # classes defined by the code are __main__.X, as in a script
    problems: list[str] = []
    results: list[tuple[Group, list[Result]]] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own warnings (a read-only buffer at load) are not ours
            exec(compile(SETUP, "<set-up>", "exec"), module.__dict__)
            snapshots: list[tuple[Entry, str, dict[str, object]]] = []
            for group in GROUPS:
                if group.setup:
                    exec(compile(_code(group.setup), f"<{group.key} set-up>", "exec"), module.__dict__)
                done = []
                for entry in group.entries:
                    result = _trigger(entry, module, library, problems)
                    done.append(result)
                    if entry.fixed:  # the namespace the trigger ran in, for its fix (run after all triggers)
                        snapshots.append((entry, result.message, dict(module.__dict__)))
                results.append((group, done))
            # The fixes register classes and change objects, which later triggers
            # must not see: they run last, each in a copy of its trigger's namespace.
            for entry, message, namespace in snapshots:
                _run_fixed(entry, message, namespace, module, problems)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous
    if problems:
        raise SystemExit(
            "docs/gen_errors.py: triggers that do not give their error, or fixes that do not run:\n  "
            + "\n  ".join(problems)
        )
    return results


FIX_SNIPPET = re.compile(r"Fix:.*?`([^`]+)`", re.S)


def fix_snippet(message: str) -> str | None:
    """The first backticked snippet after "Fix:" in a message, or ``None``."""
    m = FIX_SNIPPET.search(message)
    return m.group(1) if m else None


def _run_fixed(
    entry: Entry, message: str, namespace: dict[str, object], module: types.ModuleType, problems: list[str]
) -> None:
    """Run an entry's ``fixed`` code, with the message's snippet in place of ``{fix}``;
    a fixed variant that raises, or that leaves out the message's snippet, is a problem."""
    snippet = fix_snippet(message)
    if snippet is not None and "{fix}" not in entry.fixed:
        problems.append(f"{entry.key}: the message's fix `{snippet}` is not run by its fixed code")
        return
    if snippet is None and "{fix}" in entry.fixed:
        problems.append(f"{entry.key}: the fixed code has {{fix}} but the message has no backticked fix")
        return
    code = entry.fixed.replace("{fix}", snippet or "")
    module.__dict__.clear()
    module.__dict__.update(namespace)
    try:
        exec(compile(code, f"<{entry.key} fixed>", "exec"), module.__dict__)
    except Exception as e:
        problems.append(f"{entry.key}: the fixed code raised {type(e).__name__}: {e}")


def _trigger(entry: Entry, module: types.ModuleType, library: str, problems: list[str]) -> Result:
    """Run one entry's code; its result, or a problem added to ``problems``."""
    try:
        exec(compile(entry.code, f"<{entry.key}>", "exec"), module.__dict__)
    except Exception as e:
        where = _raised_in(e, library)
        name, message = type(e).__name__, str(e)
        # Stock torch.compile re-raises an error from tracing as InternalTorchDynamoError
        # f"{type}: {message}", with the original traceback (so ``where`` is ours);
        # the library's fix of Dynamo's _compile raises the library's error as
        # itself. Either way Dynamo appends where in the user's code it was ("from
        # user code:", which differs between releases): the page shows the
        # library's message
        if name == "InternalTorchDynamoError" and message.startswith(entry.error + ": "):
            name, message = entry.error, message[len(entry.error) + 2 :]
        if "\n\nfrom user code:" in message:
            message = message.split("\n\nfrom user code:")[0]
            # torch 2.11's Dynamo traces this script's compiled function from
            # torch.compile's own wrapper frame and names the argument
            # L['args'][0]; from a file (tests/test_members.py) it says L['t'],
            # as 2.12 - 2.15 always do. The page shows the name users read.
            message = message.replace("L['args'][0]", "L['t']")
        if where is None:
            problems.append(f"{entry.key}: raised outside the library: {name}: {message}")
        elif name != entry.error:
            problems.append(f"{entry.key}: raised {name}, expected {entry.error}: {message}")
        return Result(entry, name, message, where or "?")
    problems.append(f"{entry.key}: raised nothing")
    return Result(entry, "-", "", "?")


# ---------------------------------------------------------------------- the page


def _wrap(text: str) -> str:
    return "\n".join(
        textwrap.fill(line, WIDTH, break_long_words=False, break_on_hyphens=False) if line.strip() else ""
        for line in text.splitlines()
    )


def _fence(lang: str, body: str) -> str:
    return f"```{lang}\n{body}\n```"


HEADER = """\
# Errors

<!-- Generated by docs/gen_errors.py: do not edit. Run `python docs/gen_errors.py` after changing a
message; tests/test_errors_page.py fails while this page is out of date. -->

Every error the library raises for bad input: the exception type, when it is raised, the message
exactly as the library produces it, and the fix. The messages are not typed by hand:
`docs/gen_errors.py` runs each entry's code (after the set-up blocks, in a script's `__main__`)
and writes the page, and a test checks that the page matches on every torch leg. They are the same
on every supported torch release (2.11 to 2.15).

Every error is an `opaque_subclass.OpaqueSubclassError` (a `RuntimeError`): wrong kinds of objects
raise its subclass `opaque_subclass.OpaqueTypeError` (also a `TypeError`), bad values
`opaque_subclass.OpaqueValueError` (also a `ValueError`), missing attributes
`opaque_subclass.OpaqueAttributeError` (also an `AttributeError`), and broken rules of a flat
argument list, of an op on an `OpaqueSubclass` or of a saved program `OpaqueSubclassError` itself.
Three classes refine these: `opaque_subclass.core.walk.ValueOpaqueListedError` (an
`OpaqueTypeError`), `opaque_subclass.OpaqueMemberError` (an `OpaqueAttributeError`) and
`opaque_subclass.export.OpaqueBindingError` (also a `LookupError`). Under `torch.compile` each
reaches the caller as itself, not inside Dynamo's `InternalTorchDynamoError`.

Where a subclass is involved, the message names it (module-qualified), the attribute path and the
type found; every message has a fix after `Fix:`, and a fix in backticks runs as written: the
generator also runs each entry's code with the message's fix applied (its backticked snippet
executed) and fails if that raises, for every fix that can run in one process. For a class defined in a script or
a function the fix cannot import it and says `(with <Class> in scope)`; for a class of an importable
module it starts with the import. Paths start at a name for the argument, `x` by default
(`flatten_subclass(t, name=...)` sets it; `args[1]` is the second argument of
`unwrap_args`, with metas or without). Under `torch.compile` and `torch.export` the same checks
run on the same walk and give the same messages with Dynamo's name of the input as the root
(`L['x']._mesh` instead of `x._mesh`; non-strict export says `input._mesh` where it first walks its
inputs). Messages are wrapped at 100 columns here.
"""


def render(results: list[tuple[Group, list[Result]]]) -> str:
    out = [HEADER]
    count = sum(len(done) for _, done in results)
    out.append(f"## Contents\n\n{count} errors, in {len(results)} groups:\n")
    for group, done in results:
        out.append(f"* [{group.title}](#{group.key})")
        out.extend(f"  * `{r.error}`: [{r.entry.title}](#{r.entry.key})" for r in done)
    out.append("")
    out.append(
        "Not listed: the [errors left out](#errors-left-out) (each with the reason) and the errors of\n"
        "`opaque_subclass.sharded`, a demonstration subclass ([distributed.md](distributed.md)).\n"
    )
    out.append("## Set-up\n\nThe code of every entry runs after this block (and its group's set-up):\n")
    out.append(_fence("python", SETUP) + "\n")
    for group, done in results:
        out.append(f'<a id="{group.key}"></a>\n\n## {group.title}\n\n{" ".join(group.intro.split())}\n')
        if group.setup:
            out.append(_fence("python", _code(group.setup)) + "\n")
        for r in done:
            e = r.entry
            has_fix = "Fix:" in r.message
            out.append(f'<a id="{e.key}"></a>\n\n### `{r.error}`: {e.title}\n')
            out.append(f"**When:** {e.cause}\n")
            out.append("<!-- no-run -->\n" + _fence("python", e.code) + "\n")
            out.append(f"raises, from `{r.raised_in}`:\n")
            out.append(_fence("text", _wrap(f"{r.error}: {r.message}")) + "\n")
            out.append(f"**Fix{'' if has_fix else ' (the message has no `Fix:` part)'}:** {e.fix}\n")
    out.append('<a id="errors-left-out"></a>\n\n## Errors left out\n')
    out.append(
        "Every `raise` of `opaque_subclass/core`, `authoring`, `adoption`, `modules` and `export` has an entry above,\n"
        "except these, which no ordinary input reaches on a supported torch or which need a compilation\n"
        "or a foreign archive to show:\n"
    )
    out.append("| where | exception | why |\n| --- | --- | --- |")
    for where, error, why in LEFT_OUT:
        out.append(f"| {where} | `{error}` | {why} |")
    out.append("\nRaise sites that give the message of an entry above are not listed again:\n")
    out.extend(f"* {item};" if i < len(SAME_MESSAGE) - 1 else f"* {item}." for i, item in enumerate(SAME_MESSAGE))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check(PAGE, render(run()), __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
