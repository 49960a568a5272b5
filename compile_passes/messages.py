"""The texts of compile_passes, one constructor per situation: each lint's messages and fixes, the
recompile reasons in opaque terms and the errors of its API. The lints stay where they run: they
decide the code, the severity, the path and which situation it is; the words are built here.

The fixes of OSC004 and OSC005 share one shape, a custom op in a fence and the call it replaces
(:func:`_through_custom_op`), and one custom op template (:func:`_custom_op`).
"""

from __future__ import annotations

from collections.abc import Sequence

from opaque_subclass.core.errors import adopt_fix, describe_type, import_fix, qualified_name

__all__ = [
    "BY_IDENTITY",
    "CONTEXT_DIFFERS",
    "DEVICE_MESH",
    "DTENSOR_SHARE_FIX",
    "FLATTEN_REPLACED",
    "GROUP_OF_UNKNOWN_SOURCE",
    "PROCESS_GROUP",
    "PROFILER_ACTIVE",
    "RECIPE",
    "REFERENCE_OPAQUE",
    "all_gather_op",
    "all_reduce_op",
    "attribute_guard",
    "baked_fix",
    "baked_message",
    "closure_as_argument",
    "code_place",
    "collective_below",
    "collective_fix",
    "collective_in_graph",
    "collective_op_fix",
    "context_holds",
    "declare_opaque_attr",
    "findings_first_header",
    "group_guarded",
    "group_unguarded",
    "input_aside",
    "input_guard",
    "list_among_attributes",
    "member_changed",
    "names_count",
    "not_the_compiled_object",
    "origin",
    "own_copy",
    "own_group",
    "own_object_build",
    "own_object_unknown",
    "read_below_dynamo",
    "read_below_dynamo_fix",
    "read_few_values_fix",
    "read_guarded",
    "read_line",
    "read_made_inside",
    "read_made_inside_fix",
    "read_through_op_fix",
    "read_value",
    "reduce_scatter_op",
    "register_first",
    "registered_guard",
    "share_group_input_fix",
    "shared_opaque",
    "sharing_changed",
    "site",
    "take_out_of_meta",
    "torch_collective_fix",
    "unknown_on_finding",
    "unobserved_reads",
]


# ---------------------------------------------------------------------- shared pieces

#: Where the docs show a custom op that takes the opaque (the fixes of OSC004 and OSC005).
RECIPE = "docs/distributed.md, 'Recipe: your own collective, as a custom op that takes the opaque'"


def site(file: str, line: int, function: str) -> str:
    """``file:line in function``: where a line of the program is."""
    return f"{file}:{line} in {function}"


def origin(file: str, line: int, function: str, code: str) -> str:
    """``file:line in function: code``, as every lint names a line of the program."""
    return f"{site(file, line, function)}: {code}"


def attribute_guard(path: str, member: str, value: object) -> str:
    """A guard on an attribute's value as Dynamo writes it: ``t._group.group_name == '1'``."""
    return f"{path}.{member} == {value!r}"


def registered_guard(cls: type) -> str:
    """What guards the members of a type registered with a guard (``DeviceMesh``)."""
    return f"{cls.__name__}'s registered guard"


def _replace(at: str, old: str, new: str) -> str:
    return f"{at} replace `{old}` with `{new}`"


def _custom_op(op: str, params: str, body: Sequence[str], fake_params: str, fake_body: Sequence[str]) -> list[str]:
    """The code lines of a custom op ``opaque_fix::<op>`` returning a tensor, and its fake implementation."""
    return [
        f'@torch.library.custom_op("opaque_fix::{op}", mutates_args=())',
        f"def {op}({params}) -> torch.Tensor:",
        *body,
        "",
        "",
        f"@{op}.register_fake",
        f"def _({fake_params}):",
        *fake_body,
    ]


def _through_custom_op(lead: str, code: Sequence[str], at: str, old: str, new: str) -> str:
    """``<lead> (<recipe>):``, the op's code in a fence, then ``and <at> replace `old` with `new```."""
    return f"{lead} ({RECIPE}):\n```\n" + "\n".join(code) + "\n```\nand " + _replace(at, old, new)


# ---------------------------------------------------------------------- OSC001: a flatten context

#: Why an object in a flatten context (or baked into a graph) stands for itself, not a value.
DEVICE_MESH = "a DeviceMesh (its == compares the mesh's shape and ranks, not its process groups)"
PROCESS_GROUP = "a ProcessGroup (a communicator of this job)"
REFERENCE_OPAQUE = "a registered reference opaque (it stands for this very object)"
BY_IDENTITY = "compared by identity (its class defines no __eq__)"

_NEVER_EQUAL = (
    "torch.compile guards the context by comparing it with a deep copy, which for this object "
    "is never equal: the library refuses such an input where Dynamo meets it (stock torch "
    "fails after tracing with AssertionError: Guard failed on the same frame it was created)"
)
_STALE = (
    "torch.compile guards the context by equality and bakes it into the compiled graph, so a later "
    "call with an equal but different object passes the guard and runs with the first call's object "
    "(outputs carry a stale one)"
)
_AS_INPUT = "so that it is a graph input guarded by identity"


def context_holds(path: str, cls: type, obj: object, reason: str, holder: object | None) -> str:
    """The flatten context of ``path`` (a ``cls``) holds ``obj``, reference-like for ``reason``,
    inside ``holder`` (the innermost object whose ``==`` decides the guard) or a plain container."""
    inside = f", inside a {describe_type(holder)} whose == decides the guard" if holder is not None else ""
    consequence = _NEVER_EQUAL if reason == BY_IDENTITY else _STALE
    return (
        f"the flatten context of {path!r} ({qualified_name(cls)}) holds {describe_type(obj)}, "
        f"{reason}{inside}; {consequence}."
    )


def register_first(obj_type: type) -> str:
    """The sentence ending a fix whose object's class is not registered as an opaque."""
    return " Register its class first: " + import_fix(obj_type, "opaque_subclass.register_opaque({cls})") + "."


def declare_opaque_attr(cls: type, attr: str, obj_type: type, register: str) -> str:
    """An ``OpaqueSubclass`` whose metadata attribute ``attr`` is itself the object."""
    return (
        f"declare {attr!r} in {cls.__qualname__}.opaque_attrs = {{{attr!r}: {obj_type.__qualname__}}} "
        f"instead of meta_attrs, {_AS_INPUT}.{register}"
    )


def take_out_of_meta(cls: type, attr: str, holder: str, obj_type: type, register: str) -> str:
    """An ``OpaqueSubclass`` whose metadata attribute ``attr`` holds the object inside it."""
    return (
        f"take the {obj_type.__qualname__} out of the metadata attribute {attr!r}: declare it as an opaque "
        f"attribute of its own, {cls.__qualname__}.opaque_attrs = {{{holder!r}: {obj_type.__qualname__}}}, and "
        f"keep only values in {attr!r}, {_AS_INPUT}.{register}"
    )


def list_among_attributes(cls: type, holder: str, names: list[str], path: str, obj_type: type, register: str) -> str:
    """A hand-written subclass: list the object among what ``__tensor_flatten__`` returns (or adopt the class)."""
    return (
        f"list it among the attributes: hold it as self.{holder}, return {names!r} from "
        f"{cls.__qualname__}.__tensor_flatten__ with a context that no longer holds it "
        f"(`return {names!r}, ctx_without_it`), and read inner_tensors[{holder!r}] in __tensor_unflatten__, "
        f"{_AS_INPUT}; {adopt_fix(cls, holder, path, obj_type)}.{register}"
    )


# ---------------------------------------------------------------------- OSC002: baked into a graph

_HOW = {
    "attribute": "holds it as an attribute",
    "argument": "passes it as a constant argument",
    "closure": "calls a function that captured it",
}


def baked_message(how: str, place: str, type_name: str, reason: str) -> str:
    """A graph holds a reference-like object (``how``: attribute, argument or closure) from ``place``."""
    return (
        f"the graph {_HOW[how]} ({place}): a {type_name}, {reason}. It was fixed when the graph "
        "was compiled, so every later call that passes the guards uses this object, not the caller's."
    )


def baked_fix(unregistered: type | None, closure_fix: str | None) -> str:
    """Make it a graph input: register ``unregistered`` first when given; pass it as ``closure_fix`` says
    when there is one, else as an argument."""
    register = ""
    if unregistered is not None:
        register = (
            "register its class as a reference opaque, "
            + import_fix(unregistered, "opaque_subclass.register_opaque({cls})")
            + ", and "
        )
    return f"make it a graph input: {register}" + (
        closure_fix
        or "pass it as an argument of the compiled function, or as an opaque attribute of a subclass argument, "
        "rather than from a closure, a global or a flatten context"
    )


def closure_as_argument(name: str, params: str, variable: str, def_at: str, call_at: str, call: str) -> str:
    """A function ``name`` (``def name(params)`` at ``def_at``) captured ``variable``: a parameter
    of it instead, and an argument of its ``call`` at ``call_at``."""
    old_def = f"def {name}({params})"
    new_def = f"def {name}({params}{', ' if params.strip() else ''}{variable})"
    new_call = call[:-1].rstrip() + (", " if not call[:-1].rstrip().endswith("(") else "") + f"{variable})"
    return (
        f"pass it to {name} as an argument instead of capturing it: {_replace(f'at {def_at}', old_def, new_def)}, "
        f"and {_replace(f'at {call_at}', call, new_call)} (with `{variable}` an argument or a global of the "
        "compiled function, so that the graph takes it as an input)"
    )


# ---------------------------------------------------------------------- OSC003: inputs sharing an opaque


def shared_opaque(a: str, b: str, type_name: str, own_object: str) -> tuple[str, str]:
    """``(message, fix)``: inputs ``a`` and ``b`` hold one object; ``own_object`` says how to give
    ``b`` one of its own."""
    message = (
        f"inputs {a} and {b} hold one {type_name} object; the graph is compiled for that sharing and "
        f"guarded on it ({a} is {b}): a call where they hold different objects recompiles."
    )
    fix = (
        f"nothing, if the sharing is intended: each sharing pattern gets one graph, so calls where {a} "
        f"and {b} sometimes hold one object and sometimes two compile twice in all, not once per call. "
    )
    return message, fix + own_object


def _own_object(path: str, how: str) -> str:
    return f"If {path} should be an object of its own, {how}."


def own_object_unknown(path: str) -> str:
    """No code for it: the path is not assignable as written, or the type is unknown."""
    return _own_object(path, "pass it one")


def own_object_build(path: str, cls: type) -> str:
    """A type without a default copy."""
    return _own_object(path, f"build it with a {cls.__qualname__} of its own")


def _own_object_code(path: str, code: str, note: str) -> str:
    root = path.split(".", 1)[0].split("[", 1)[0]
    return _own_object(path, f"give it one before the call: `{code}`{note} ({root}: the argument passed as {root})")


def own_group(path: str) -> str:
    """A process group: a new communicator over the same ranks."""
    code = f"import torch.distributed as dist; {path} = dist.new_group(dist.get_process_group_ranks({path}))"
    return _own_object_code(path, code, " (a new communicator over the same ranks: every rank of the group runs it)")


def own_copy(path: str) -> str:
    """A type whose ``copy.copy`` is Python's default."""
    return _own_object_code(path, f"import copy; {path} = copy.copy({path})", "")


# ---------------------------------------------------------------------- recompile reasons in opaque terms


def sharing_changed(a: str, b: str, now_shared: bool) -> str:
    """A guard on ``a is b`` (``now_shared``: ``a is not b``) failed."""
    if now_shared:
        return f"inputs `{a}` and `{b}` now share one object (the graph was compiled for distinct objects)"
    return f"inputs `{a}` and `{b}` no longer share one object (the graph was compiled for one shared object)"


def not_the_compiled_object(name: str) -> str:
    """An identity guard (``___check_obj_id``) failed."""
    return (
        f"`{name}` is not the object the graph was compiled with (it is guarded by identity: a constant of the graph)"
    )


FLATTEN_REPLACED = (
    "a subclass class's __tensor_flatten__ is no longer the one the graph was compiled with (replaced, "
    "adopted, or its declared attributes changed): every instance flattened alike, so the class was "
    "guarded instead of each input"
)
CONTEXT_DIFFERS = (
    "a subclass input's flatten context differs (by ==) from the one the graph was compiled with: the "
    "context is a constant of the graph"
)


def member_changed(obj: str, member: str, call: bool, value: str, group: bool) -> str:
    """A guard on ``obj.member`` (``call``: ``obj.member()``) ``== value`` failed; ``group``: the member
    is a process group's name."""
    read = f"{obj}.{member}()" if call else f"{obj}.{member}"
    said = (
        f"`{read}` is no longer {value}: the graph was compiled with that value (read on the object at "
        "compile time and guarded)"
    )
    if group:
        said += (
            f"; `{obj}` is another process group than the graph's, whose name a collective in the graph "
            "names as a constant (one compilation per group)"
        )
    return said


def input_guard(text: str, inputs: Sequence[str]) -> str:
    """Another guard, on the ``inputs`` it names."""
    return f"{text} (a guard on input {', '.join(f'`{i}`' for i in inputs)})"


# ---------------------------------------------------------------------- OSC004, OSC006: values read while tracing


PROFILER_ACTIVE = (
    "compile_passes: another profiler is active; reads (OSC004) and collectives (OSC005) below Dynamo are not watched"
)


def read_value(value: object, known: bool) -> str:
    """The value a read compiled in, as the texts show it."""
    return repr(value) if known else "its result"


def input_aside(path: str | None, receiver: str | None) -> str:
    """`` (t._group)``: the opaque's input path, where the code names it otherwise; else ``""``."""
    return f" ({path})" if path is not None and path != receiver else ""


def code_place(function: str, file: str, line: int) -> str:
    """``function (file:line)``: where a fix changes the program."""
    return f"{function} ({file}:{line})"


def read_line(read: str, aside: str, value: str, in_dynamo: bool, origin: str, guarded: bool, guard: str | None) -> str:
    """One line of a report: the read (``read`` + ``aside``), its value, where and what guards it."""
    where = "in the compiled function" if in_dynamo else "below Dynamo"
    guarded_by = f"guarded: {guard}" if guarded else "not guarded"
    return f"{read}{aside} -> {value}, read {where} at {origin}; {guarded_by}"


def read_guarded(read: str, aside: str, owner: str, origin: str, value: str, guard: str | None) -> str:
    """Read as Dynamo traced the compiled function, and guarded."""
    return (
        f"`{read}`{aside} is evaluated on the real {owner} while Dynamo traces the compiled function "
        f"({origin}) and compiled in as {value}; a guard protects it ({guard}): a call where it "
        "differs compiles again, one compilation per distinct value."
    )


def read_made_inside(read: str, owner: str, origin: str, value: str) -> str:
    """Read as Dynamo traced the compiled function, on an opaque made in the graph: no guard."""
    return (
        f"`{read}` is evaluated on the real {owner} while Dynamo traces the compiled function "
        f"({origin}) and compiled in as {value} with no guard of its own: the {owner} was made inside "
        "the graph, so Dynamo has no source to guard it by, and a later call where it differs reuses "
        f"{value} (a wrong result) unless a guard on what it was made from fails first."
    )


def read_below_dynamo(read: str, aside: str, an_input: bool, owner: str, function: str, origin: str, value: str) -> str:
    """Read while AOTAutograd traced the graph (running ``function``), with no guard; ``an_input``:
    the opaque is an input of the graph."""
    input_note = "" if an_input else f" (a {owner} that is not an input of the graph)"
    return (
        f"`{read}`{aside}{input_note} is evaluated on the real {owner} while the graph is traced "
        f"below Dynamo (AOTAutograd running {function}, {origin}), and {value} is compiled into "
        f"the graph with no guard: the compiled graph serves every later call, whatever that call's {owner} "
        "returns (a wrong result)."
    )


def read_made_inside_fix(receiver: str | None, owner: str, member: str, place: str) -> str:
    """Fix of :func:`read_made_inside`: make the opaque (named ``receiver`` at ``place``) an input."""
    made = receiver or f"the {owner}"
    return (
        f"make {made} an input: compute it before the call and pass it to the compiled function as an "
        f"argument (or hold it as an opaque attribute of the subclass), and read `.{member}` on that "
        f"argument in {place}: Dynamo then guards the value (one compilation per distinct value)."
    )


def _class_import(cls: type) -> str:
    """The import that puts ``cls`` in scope, or a comment saying it must be."""
    module, qualname = cls.__module__, cls.__qualname__
    if "<locals>" in qualname or module in ("__main__", "builtins"):
        return f"# with {cls.__name__} in scope"
    top = qualname.split(".", 1)[0]
    return f"from {module} import {top}"


def read_through_op_fix(
    owner: type,
    member: str,
    call: bool,
    value: object,
    read: str,
    place: str,
    op: str,
    receiver: str,
    guarded: str | None,
) -> str:
    """A number read (``read`` at ``place``): a custom op ``op`` reads it when the graph runs, called on
    ``receiver``; where a Python number is needed, the ``guarded`` read instead (else the guarded read kept)."""
    dtype = "torch.bool" if isinstance(value, bool) else "torch.int64" if isinstance(value, int) else "torch.float64"
    use = f"obj.{member}()" if call else f"obj.{member}"
    code = [
        "import torch",
        _class_import(owner),
        "",
        "",
        *_custom_op(
            op,
            f"obj: {owner.__qualname__}",
            [f"    return torch.tensor({use}, dtype={dtype})  # read when the graph runs, on this call's object"],
            "obj",
            [f"    return torch.empty((), dtype={dtype})"],
        ),
    ]
    number = (
        f"read `{guarded}` in the compiled function instead, where it is guarded"
        if guarded is not None
        else "keep the guarded read"
    )
    lead = f"read it when the graph runs, through a custom op that takes the {owner.__name__}"
    return (
        _through_custom_op(lead, code, f"in {place}", read, f"{op}({receiver})") + ": a 0-d tensor holding the value, "
        f"for where it meets tensors (`x / n`); where a Python number is needed, such as a shape, {number}."
    )


def read_below_dynamo_fix(read: str, place: str, owner: str) -> str:
    """Another read below Dynamo: ``read`` in the compiled function and its value passed to ``place``,
    or a custom op."""
    return (
        f"read `{read}` in the compiled function, where Dynamo guards it, and pass the "
        f"value to {place} (as an argument or a tensor), or compute with the {owner} inside a "
        f"custom op that takes it ({RECIPE}), so that the value is read when the graph runs."
    )


def read_few_values_fix(read: str, owner: str) -> str:
    """A guarded read in the compiled function: nothing, or a custom op."""
    return (
        f"nothing, if `{read}` takes few values across calls (one compilation each); else compute with "
        f"the {owner} inside a custom op that takes it ({RECIPE}), so that the value is read when "
        "the graph runs."
    )


def unobserved_reads(graph_name: str, path: str, reason: str) -> tuple[str, str]:
    """``(message, fix)`` of OSC006: the graph takes opaques (the first at ``path``), but the reads
    Dynamo makes are not recorded, for ``reason``."""
    message = (
        f"{graph_name} takes opaques ({path}, ...), but {reason}: values compiled code read from them "
        "while Dynamo traced (lint OSC004) cannot be seen here."
    )
    fix = (
        "run the check on a torch release the library supports in full (python -m opaque_subclass lists the fixes "
        "on), with opaque_subclass enabled (opaque_subclass.enable())"
    )
    return message, fix


# ---------------------------------------------------------------------- OSC005: collectives on a named group


#: A process group as the texts name it: ``(name, its global ranks here or None)``.
_Named = tuple[str, tuple[int, ...] | None]


_HEADER = [
    "import torch",
    "import torch.distributed as dist",
    "from torch.distributed.distributed_c10d import ProcessGroup",
    "",
    "",
]


def all_reduce_op(reduce_op: str, tensor: str, group: str, functional: bool) -> tuple[list[str], str]:
    """``(code lines, replacement call)``: an all-reduce (functional, or ``dist``'s in place) taking the group."""
    op = f"all_reduce_{reduce_op}"
    reduce = f"    dist.all_reduce(out, op=dist.ReduceOp.{reduce_op.upper()}, group=group)  # this call's group"
    body = ["    out = x.clone()", reduce, "    return out"]
    code = _custom_op(op, "x: torch.Tensor, group: ProcessGroup", body, "x, group", ["    return torch.empty_like(x)"])
    return code, f"{op}({tensor}, {group})" if functional else f"{tensor}.copy_({op}({tensor}, {group}))"


def _sized_op(op: str, dim: str, body: Sequence[str], resize: str) -> list[str]:
    """A custom op taking the group and its size, whose output is its input with dimension ``dim``
    resized by it (``resize``: ``*=`` or ``//=``)."""
    fake_body = ["    shape = list(x.shape)", f"    shape[{dim}] {resize} size", "    return x.new_empty(shape)"]
    return _custom_op(
        op, f"x: torch.Tensor, {dim}: int, group: ProcessGroup, size: int", body, f"x, {dim}, group, size", fake_body
    )


def all_gather_op(tensor: str, dim: str, group: str) -> tuple[list[str], str]:
    """``(code lines, replacement call)``: an all-gather taking the group and its size."""
    gather = "    dist.all_gather_into_tensor(out, x.contiguous(), group=group)  # this call's group"
    concatenated = "    return torch.cat(out.chunk(size), dim=gather_dim) if gather_dim != 0 else out"
    body = ["    out = x.new_empty((size * x.shape[0], *x.shape[1:]))", gather, concatenated]
    code = _sized_op("all_gather_tensor", "gather_dim", body, "*=")
    return code, f"all_gather_tensor({tensor}, {dim}, {group}, {group}.size())"


def reduce_scatter_op(reduce_op: str, tensor: str, dim: str, group: str) -> tuple[list[str], str]:
    """``(code lines, replacement call)``: a reduce-scatter taking the group and its size."""
    op = f"reduce_scatter_{reduce_op}"
    chunks = ["    chunks = x.chunk(size, dim=scatter_dim)", "    out = torch.empty_like(chunks[0])"]
    reduce = f"    dist.reduce_scatter_tensor(out, torch.cat(chunks).contiguous(), op=dist.ReduceOp.{reduce_op.upper()}, group=group)"
    code = _sized_op(op, "scatter_dim", [*chunks, reduce, "    return out"], "//=")
    return code, f"{op}({tensor}, {dim}, {group}, {group}.size())"


def collective_fix(call_site: str, code: Sequence[str], call: str, replacement: str, group: str) -> str:
    """A collective called on a line of its own: the custom op taking the group, and the call it replaces."""
    lead = "issue the collective through a custom op that takes the group as an opaque input, so one graph serves every group"
    return (
        _through_custom_op(lead, [*_HEADER, *code], f"at {call_site}", call, replacement)
        + f" ({group} must be a ProcessGroup; for a DeviceMesh, take `mesh: DeviceMesh` in the op and call "
        "`mesh.get_group()` in its body)."
    )


def _groups(groups: Sequence[_Named]) -> str:
    named = []
    for name, ranks in groups:
        on = f" (ranks {list(ranks)} here)" if ranks is not None else ""
        named.append(f"{name!r}{on}")
    return ("process group " if len(named) == 1 else "process groups ") + ", ".join(named)


def collective_in_graph(op: str, groups: Sequence[_Named], origin: str) -> str:
    """A collective of Dynamo's graph (traced from ``origin``) on ``groups``, named by a constant."""
    return f"the graph runs {op} on {_groups(groups)}, named by a constant of the graph ({origin})."


def collective_below(op: str, groups: Sequence[_Named], issuer: str | None, call_site: str, origin: str) -> str:
    """A collective ``issuer`` issued below Dynamo (at ``call_site``, or ``""``) on ``groups``, named by a constant."""
    issued = f"{issuer} ({call_site})" if call_site else issuer
    return (
        f"the graph runs {op} on {_groups(groups)}, issued below Dynamo by {issued} while "
        f"AOTAutograd traced {origin}, and named by a constant of the graph it compiled."
    )


def group_guarded(source: str | None, guard: str | None, compilations: int) -> str:
    """A guard compares the name of the group from ``source``: one compilation per group (``compilations`` so far)."""
    comes_from = f"`{source}`" if source else "the group"
    return (
        f"The group comes from {comes_from}, and Dynamo guards its name (`{guard}`): a call with another group "
        "compiles again, one compilation per group"
        + (f" ({compilations} so far)" if compilations > 1 else "")
        + ", and ranks in other groups compile graphs of their own, so no compile cache entry is shared across "
        "them."
    )


def group_unguarded(source: str, group_name: str) -> str:
    """Nothing guards the group of input ``source``: another group runs this graph on this one."""
    return (
        f"The group comes from `{source}`, and nothing guards it: a later call whose {source} is another "
        f"group runs this graph on {group_name!r} (a collective on the wrong group, with no recompilation)."
    )


#: Where the group comes from is not known (a graph linted outside its compilation, a group of no input).
GROUP_OF_UNKNOWN_SOURCE = (
    "The graph is that group's program: another group gets a compilation of its own only where a guard "
    "compares it, and ranks in other groups compile graphs of their own, so no compile cache entry is shared "
    "across them."
)


def collective_op_fix(in_graph: bool) -> str:
    """A collective that cannot be rewritten as written: a custom op taking the group, in words."""
    if in_graph:
        return (
            "issue the collective through a custom op whose schema takes the group (or its DeviceMesh) as an "
            "opaque input, and pass the subclass's group attribute to it, so one graph serves every group: "
            f"see {RECIPE}."
        )
    return (
        "issue the collective through a custom op whose schema takes the group (or its DeviceMesh) as "
        f"an opaque input, so one graph serves every group (see {RECIPE})."
    )


def share_group_input_fix(source: str) -> str:
    """The other way out for a collective issued below Dynamo on the group of input ``source``."""
    return (
        f" Or, with inductor, compile and make the first call inside `with opaque_subclass.dtensor.share_compiles():` "
        f"(torch 2.12 - 2.15; docs/large_jobs.md): the collective then takes its group from `{source}`, a graph "
        "input, when it runs, and one graph serves every group and rank."
    )


DTENSOR_SHARE_FIX = (
    "compile and make the first call inside `with opaque_subclass.dtensor.share_compiles():` "
    "(torch 2.12 - 2.15; docs/large_jobs.md): DTensor's collectives then take their group from "
    "the mesh graph input when they run, and one graph serves every group and rank."
)


def torch_collective_fix(issuer: str | None) -> str:
    """A collective torch's own code issues (not DTensor's)."""
    return (
        f"the collective is torch's ({issuer}): a sharded tensor whose collectives are custom ops "
        "taking the group (the library's opaque_subclass.sharded.ShardedTensor) has none of these "
        f"constants; see {RECIPE}."
    )


# ---------------------------------------------------------------------- explain, the backend, the inputs report


def findings_first_header(function: str) -> str:
    """The line ``explain`` logs before the findings it reports ahead of torch's messages."""
    return f"compile_passes.explain: findings on the compilation of {function}, before what torch says about it:"


def unknown_on_finding(on_finding: object, choices: Sequence[str]) -> ValueError:
    return ValueError(f"checking_backend: on_finding={on_finding!r}; expected one of {', '.join(map(repr, choices))}.")


def names_count(names: int, args: int) -> ValueError:
    return ValueError(
        f"explain_flat_inputs: {names} names for {args} arguments. Fix: give one "
        "name per argument, or names=None for args[0], args[1], ..."
    )
