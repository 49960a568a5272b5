"""The check of the opaques a compiled forward saves for its backward (torch
2.11 - 2.15).

Every forward of a compiled function that saves opaques for its backward (the
meshes its gradients are rebuilt with) asserts, per saved object, that its class
is a registered opaque: torch's registry lookup (a ``WeakKeyDictionary``, twice)
and a call into its C++ registry by class name, on every call. The answer for a
class changes only when the class is registered again or unregistered, and both
replace its entry in torch's registry; so the answer is kept per registry entry.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.weak import remember

__all__ = ["make_saved_opaque_check"]


def make_saved_opaque_check(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.runtime_wrappers.is_opaque_type``
    (torch 2.11, 2.12 and 2.13) and its torch 2.14 name
    ``torch._functorch._aot_autograd.runtime_wrappers.is_custom_class`` (torch
    2.14 and 2.15): the run-time module's own import of the registry check, and
    only that import (torch's public function is unchanged). Its one use there:
    the compiled forward's assertion that each opaque saved for the backward is
    of a registered class (the opaque slots of pytorch/pytorch#176457).

    Without it, every forward with saved opaques looks each one's class up in
    torch's registry twice (``WeakKeyDictionary`` membership and item, each a
    Python call building a weak reference) and asks the C++ registry by class
    name: torch's check costs about 6,000 machine instructions per saved opaque
    per call (callgrind, torch 2.13; ``all(check(type(o)) for o in saved)`` over
    eight meshes), a fifth of the gap between a compiled forward and backward on
    eight subclass inputs and its hand-written floor. With it, a class found in
    torch's registry gets torch's answer once per registry entry, then that
    answer from a dictionary keyed by the class, checked against the class's
    current entry (about 1,900 instructions in the same measure); a class
    registered again or unregistered (torch 2.15's ``unregister_custom_class``)
    has a new entry or none, and is asked of torch again. Every other argument
    (a name, a subclass of a registered class, an unregistered class) is torch's
    function, unchanged.
    """
    registry: Any = importlib.import_module("torch._library.opaque_object")._OPAQUE_TYPES
    entries = registry.data  # weak reference to a class -> its registry entry
    entry_of = entries.get
    # id(class) -> (weak reference to it, the registry entry torch answered for, the answer);
    # dropped with the class
    answers: dict[int, tuple[Any, Any, bool]] = {}
    known_answer = answers.get

    def ask_torch(cls: Any) -> bool:
        try:
            weak = weakref.ref(cls)
        except TypeError:  # a class name, or an object that takes no weak reference
            return original(cls)  # type: ignore[no-any-return]
        entry = entry_of(weak)
        answer = original(cls)
        if entry is not None and entry_of(weak) is entry:  # a class of its own entry, not registered again meanwhile
            remember(answers, id(cls), cls, entry, answer)
        return answer  # type: ignore[no-any-return]

    def saved_opaque_class_is_registered(cls: Any) -> bool:
        # an id stays this class's while the entry exists: the weak reference drops it with the class
        known = known_answer(id(cls))
        if known is not None and entry_of(known[0]) is known[1]:
            return known[2]
        return ask_torch(cls)

    return saved_opaque_class_is_registered
