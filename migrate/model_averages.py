"""EMA and averaged copies of the wrapped model (torch's ``AveragedModel`` and its
subclasses, timm's ``ModelEma``/``ModelEmaV2``/``ModelEmaV3``, ultralytics' ``ModelEMA``, an
EMA class of the file).

An averaged copy only reads the model it follows: it deep-copies the module when built and
reads its weights and buffers at each update. After the RoundPipe wrap it gets the wrapped
module (``model.model``), the module the original handed it: a deep copy of that is a plain
module (:mod:`roundpipe.load_hook`), and its weights are the ones the forward uses. The
runtime writes them only on the main thread (in ``step`` and ``synchronize``), so an update
on the main thread never reads them torn: under ``--exact`` they are the original's numbers;
in the asynchronous form an update inside the training loop sees the weights one step old,
as every other read of the weights there (:meth:`migrate.synchronize.Synchronizations.after_training`),
and one after the loop gets a ``synchronize()`` first.

A call that writes the average back into the model (``ema.copy_to(model)``, ``restore``,
``apply_shadow``) writes the weights after the optimizer holds its copies of them: refused
(RPM141), as is an EMA class of the file whose methods write the model it was given or
keeps. A method of an averaged copy not known to only read the model is refused (RPM114).
"""

from __future__ import annotations

import re
from typing import Iterator, List, Optional, Set

import libcst as cst
import libcst.matchers as m

from .names import ModuleFacts
from .plan import Blocked, Plan
from .syntax import code
from .weight_writes import check_weight_write

__all__ = ["AVERAGE_NAME", "check_parameters_handed", "hand_to_average", "kept_by"]

#: how real code names an averaged copy, its class or the object holding one
AVERAGE_NAME = re.compile(r"(?:^|_)(?:ema|swa)(?:_|\d|$)|Ema|EMA|Swa|SWA|MovingAverage|Averaged")

#: library classes building an averaged copy, and their methods that read the model handed to them
_LIBRARY_UPDATES = {
    "torch.optim.swa_utils.AveragedModel": {"update_parameters"},
    "timm.utils.ModelEma": {"update", "set"},
    "timm.utils.ModelEmaV2": {"update", "set"},
    "timm.utils.ModelEmaV3": {"update", "set"},
    "timm.utils.model_ema.ModelEma": {"update", "set"},
    "timm.utils.model_ema.ModelEmaV2": {"update", "set"},
    "timm.utils.model_ema.ModelEmaV3": {"update", "set"},
    "ultralytics.utils.torch_utils.ModelEMA": {"update", "update_attr"},
}
_READING_METHODS = set().union(*_LIBRARY_UPDATES.values())
_PLAIN_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module", "builtins.object", "object"}

#: methods that write an average (or stored weights) back into the model handed to them
_WRITE_BACKS = {"copy_to", "restore", "apply_to", "apply_shadow", "swap", "load_into", "copy_back", "transfer_to"}


def hand_to_average(facts: ModuleFacts, plan: Plan, arg: cst.Arg, access: cst.BaseExpression, name: str) -> bool:
    """``access`` (the wrapped model ``name``) is the argument ``arg`` of a call building an
    averaged copy or of a reading method of one: plan ``access`` -> ``access.model`` and
    return True. False for any other call. Raises :class:`Blocked` for a write-back (RPM141)
    or an unknown method of an averaged copy (RPM114)."""
    call = facts.parent(arg)
    if not isinstance(call, cst.Call) or arg.value is not access:
        return False
    if _builds_average(facts, call):
        for klass in _file_classes(facts, call.func):
            _check_reads_only(facts, plan, klass, "__init__", call, arg, name)
        _plan_module(plan, call, access, name, "an averaged copy follows the wrapped module")
        return True
    if not (isinstance(call.func, cst.Attribute) and _is_average_object(facts, call.func.value)):
        return False
    method = call.func.attr.value
    if not any(_builds_average(facts, built) for built in facts.subtree(facts.module, cst.Call)):
        raise Blocked(
            call,
            "RPM114",
            f"`{code(call.func)}(...)` is handed the wrapped model {name!r}, but no averaged copy of a class the tool "
            "knows is built in this file (built elsewhere, or from a class not listed); left untouched",
        )
    if method in _WRITE_BACKS:
        raise Blocked(
            call,
            "RPM141",
            f"`{code(call)}` writes an averaged copy back into the weights of {name!r} after the RoundPipe "
            "wrap, when the optimizer already holds its own copies of them: the next step would write the "
            "copies back over it; evaluate the averaged copy itself, or migrate by hand",
        )
    defined = [k for k in _average_classes(facts) if _method(k, method) is not None]
    if not defined and method not in _READING_METHODS:
        raise Blocked(
            call,
            "RPM114",
            f"`{code(call.func)}(...)` is handed the wrapped model {name!r}, a method of an averaged copy the "
            "tool does not know to only read it; left untouched",
        )
    for klass in defined:
        _check_reads_only(facts, plan, klass, method, call, arg, name)
    _plan_module(plan, call, access, name, "the averaged copy reads the wrapped module")
    return True


def check_parameters_handed(facts: ModuleFacts, attribute: cst.Attribute, name: str) -> None:
    """Raise :class:`Blocked` (RPM114) when ``model.parameters()`` (``attribute`` is its
    ``model.parameters``) is handed to an averaged copy or a method of one
    (``ExponentialMovingAverage(model.parameters())`` of torch_ema, ``ema.copy_to(model.parameters())``):
    such an object keeps the parameters themselves and its ``copy_to``/``restore``/
    ``average_parameters`` write them in place, which the next step would write over."""
    call = facts.parent(attribute)
    arg = facts.parent(call)
    outer = facts.parent(arg)
    if not (isinstance(call, cst.Call) and isinstance(arg, cst.Arg) and isinstance(outer, cst.Call)):
        return
    func = outer.func
    named = _is_average_object(facts, func) or (
        isinstance(func, cst.Attribute) and _is_average_object(facts, func.value)
    )
    if named or any(q.startswith("torch_ema.") for q in facts.qualified(func)):
        raise Blocked(
            outer,
            "RPM114",
            f"`{code(outer.func)}(...)` is handed the parameters of the wrapped model {name!r}: an average kept on the "
            "parameters themselves writes them in place (`copy_to`, `restore`, `average_parameters`), which the next "
            'step would write over; build the EMA from the module instead (a class listed under "EMA and averaged '
            'copies"), or migrate by hand',
        )


def kept_by(facts: ModuleFacts, arg: cst.Arg) -> Optional[cst.Name]:
    """When ``arg`` hands the model to the constructor of an EMA class of the file that keeps
    it on ``self`` (``self.online_model = model``), the name the new object is bound to: its
    methods read the model's weights whenever they run, so each of its uses is a read of the
    weights. None when it keeps nothing. Raises :class:`Blocked` (RPM114) when the object is
    not bound to a plain name whose every use calls one of its methods (it is returned, handed
    on or held in an attribute: its reads after training could not be found)."""
    call = facts.parent(arg)
    if not isinstance(call, cst.Call):
        return None
    kept = False
    for klass in _file_classes(facts, call.func):
        init = _method(klass, "__init__")
        parameter = _parameter(init, call, arg) if init is not None else None
        kept = kept or (init is not None and parameter is not None and bool(_kept_as(facts, init, parameter)))
    if not kept:
        return None
    assign = facts.parent(call)
    target = assign.targets[0].target if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
    scope = facts.scope(call)
    if isinstance(target, cst.Name) and scope is not None:
        uses = [a for a in facts.accesses(target.value, scope) if facts.order(a) > facts.order(assign)]
        if all(_read_through(facts, use) for use in uses):
            return target
    raise Blocked(
        call,
        "RPM114",
        f"`{code(call)}` keeps the wrapped module, so each of its methods reads the weights; it is not bound to a "
        "name whose every use reads an attribute or calls a method of it (returned, handed on or held in an "
        "attribute), so its reads after training cannot be given a synchronize; left untouched",
    )


def _read_through(facts: ModuleFacts, use: cst.BaseExpression) -> bool:
    """``use`` reads an attribute or calls a method of the object (``ema.update()``, ``ema.ema_model``)."""
    attribute = facts.parent(use)
    return isinstance(attribute, cst.Attribute) and attribute.value is use


def _plan_module(plan: Plan, call: cst.Call, access: cst.BaseExpression, name: str, why: str) -> None:
    plan.edits.replace_expression(access, lambda updated: cst.Attribute(value=updated, attr=cst.Name("model")))
    plan.rewrites.append((call, f"{name} -> {name}.model in {code(call.func)}(...): {why}"))


def _builds_average(facts: ModuleFacts, call: cst.Call) -> bool:
    """``call`` builds an averaged copy: a known library class, a class of the file deriving
    from one, or a class of the file named as an EMA/averaged model."""
    if facts.qualified(call.func) & set(_LIBRARY_UPDATES):
        return True
    classes = _file_classes(facts, call.func)
    return bool(classes) and all(_is_average_class(facts, k) for k in classes)


def _file_classes(facts: ModuleFacts, func: cst.BaseExpression) -> List[cst.ClassDef]:
    """The classes of this file that the name ``func`` may be bound to."""
    scope = facts.scope(func)
    if not isinstance(func, cst.Name) or scope is None:
        return []
    bound = [getattr(a, "node", None) for a in scope[func.value]]
    return [node for node in bound if isinstance(node, cst.ClassDef)]


def _is_average_class(facts: ModuleFacts, klass: cst.ClassDef) -> bool:
    """A subclass of a known averaged-copy class, or a class named as one that derives from
    nothing but ``nn.Module``/``object`` (its methods are checked where they get the model)."""
    bases = [facts.qualified(base.value) for base in klass.bases]
    if any(names & set(_LIBRARY_UPDATES) for names in bases):
        return True
    plain = all(names & _PLAIN_BASES for names in bases)
    return plain and bool(AVERAGE_NAME.search(klass.name.value))


def _average_classes(facts: ModuleFacts) -> Iterator[cst.ClassDef]:
    for klass in facts.subtree(facts.module, cst.ClassDef):
        if _is_average_class(facts, klass):
            yield klass


def _is_average_object(facts: ModuleFacts, receiver: cst.BaseExpression) -> bool:
    """``model_ema``, ``self.ema``, ``swa_model``: a name or attribute named as an averaged copy."""
    last = receiver.attr.value if isinstance(receiver, cst.Attribute) else getattr(receiver, "value", "")
    return isinstance(last, str) and bool(AVERAGE_NAME.search(last))


def _method(klass: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    for statement in klass.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None


def _parameter(function: cst.FunctionDef, call: cst.Call, arg: cst.Arg) -> Optional[str]:
    """The parameter of ``function`` (a method: ``self`` skipped) that ``arg`` of ``call`` binds."""
    names = [p.name.value for p in function.params.params[1:]]
    if arg.keyword is not None:
        return arg.keyword.value
    if any(a.star for a in call.args[: call.args.index(arg) + 1]):
        return None
    index = call.args.index(arg)
    return names[index] if index < len(names) else None


def _check_reads_only(
    facts: ModuleFacts, plan: Plan, klass: cst.ClassDef, method: str, call: cst.Call, arg: cst.Arg, name: str
) -> None:
    """Raise :class:`Blocked` (RPM141) when ``klass.method`` writes the model ``arg`` hands it,
    directly or through an attribute of ``self`` bound to it in the class (``self.online = model``);
    RPM114 when it is not known where the model goes (a ``*args`` parameter)."""
    function = _method(klass, method)
    if function is None:
        return  # inherited from the library class, which reads it
    parameter = _parameter(function, call, arg)
    if parameter is None:
        raise Blocked(call, "RPM114", f"it is not known which parameter of {klass.name.value}.{method} gets {name!r}")
    reads: List[cst.BaseExpression] = list(_name_reads(facts, function, parameter))
    for attribute in _kept_as(facts, function, parameter):
        reads.extend(_self_reads(facts, klass, attribute))
    for read in reads:
        check_weight_write(facts, plan, read, f"{name} (as {code(read)} in {klass.name.value})")


def _name_reads(facts: ModuleFacts, function: cst.FunctionDef, parameter: str) -> Iterator[cst.Name]:
    for node in facts.subtree(function.body, cst.Name):
        if node.value == parameter and not _is_attribute_name(facts, node):
            yield node


def _is_attribute_name(facts: ModuleFacts, node: cst.Name) -> bool:
    parent = facts.parent(node)
    return isinstance(parent, cst.Attribute) and parent.attr is node


def _kept_as(facts: ModuleFacts, function: cst.FunctionDef, parameter: str) -> Set[str]:
    """The attributes of ``self`` that ``function`` binds to ``parameter`` itself."""
    kept: Set[str] = set()
    for assign in facts.subtree(function.body, cst.Assign):
        if m.matches(assign.value, m.Name(parameter)):
            for target in assign.targets:
                if m.matches(target.target, m.Attribute(value=m.Name("self"))):
                    assert isinstance(target.target, cst.Attribute)
                    kept.add(target.target.attr.value)
    return kept


def _self_reads(facts: ModuleFacts, klass: cst.ClassDef, attribute: str) -> Iterator[cst.Attribute]:
    """Every read of ``self.<attribute>`` in the class (not its bindings)."""
    for node in facts.subtree(klass.body, cst.Attribute):
        if m.matches(node, m.Attribute(value=m.Name("self"), attr=m.Name(attribute))):
            if not isinstance(facts.parent(node), cst.AssignTarget):
                yield node
