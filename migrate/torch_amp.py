"""Rewrite rules for torch.amp / torch.cuda.amp GradScaler training scripts.

For every GradScaler the module constructs, the rules follow the scaler to each
``scaler.scale(loss).backward()`` and recognise the training step around it:

    [optimizer.zero_grad()]                       # optional, before the forward
    with autocast(...):                           # optional, kept as it is
        out = model(inputs...)                    # the forward: one call of the model
        loss = criterion(out, labels)             # assignments computing the loss
    scaler.scale(loss).backward()
    ...                                           # statements not touching the optimizer
    [if condition:]                               # gradient accumulation
        scaler.unscale_(optimizer); clip...(model.parameters(), ...)
        scaler.step(optimizer); scaler.update()
        optimizer.zero_grad(); model.zero_grad(); scheduler.step()

and rewrite it into the RoundPipe form (a loss function for ``forward_backward``, a step
function for ``model.step``, ``scaler.update()`` on the main thread). The model is wrapped
with ``roundpipe.RoundPipe`` right before the optimizer is built, and the optimizer is built
on ``model.optim_parameters()``. Anything not understood raises :class:`Blocked`, and the
caller leaves the whole file untouched with that diagnostic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m

from .edits import Edits, carry_comments, drop_keeping_comments
from .names import CLIP_FUNCTIONS, LR_SCHEDULER_PREFIX, PARALLEL_WRAPPERS, ModuleFacts, argument_for

__all__ = ["Blocked", "ModelUses", "Plan", "TorchAmpRules", "plan_torch_amp", "NUM_MICROBATCH"]

NUM_MICROBATCH = "NUM_MICROBATCH"
_NO_GRAD = {"torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad",
            "torch.autograd.grad_mode.inference_mode"}
_EMPTY = cst.Module([])


def code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


class Blocked(Exception):
    """A construct the rules do not fully understand: leave the file, report this."""

    def __init__(self, node: cst.CSTNode, code: str, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.code = code
        self.message = message


@dataclass
class Binding:
    """A name as seen from one scope: the node that bound it there (None: a parameter)."""

    scope: object
    name: str
    statement: Optional[cst.SimpleStatementLine]
    value: Optional[cst.BaseExpression]


@dataclass
class Plan:
    """Everything the rules decided for one module."""

    edits: Edits = field(default_factory=Edits)
    rewrites: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    wrapped_optimizers: Set[int] = field(default_factory=set)
    wrapped_models: List[Tuple[object, str, int]] = field(default_factory=list)  # scope, name, after (source order)
    helper_names: Set[str] = field(default_factory=set)


def _method_call(node: cst.CSTNode, owner: str, method: str) -> bool:
    """``owner.method(...)`` with ``owner`` a plain name."""
    return m.matches(node, m.Call(func=m.Attribute(value=m.Name(owner), attr=m.Name(method))))


def _only_expression(statement: cst.BaseStatement) -> Optional[cst.BaseExpression]:
    """The expression of a one-expression statement line, else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr):
            return small.value
    return None


def _names_in(node: cst.CSTNode) -> List[str]:
    found: List[str] = []

    class Collect(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.append(name.value)

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False

        def visit_Arg(self, arg: cst.Arg) -> bool:
            arg.value.visit(self)
            return False

    node.visit(Collect())
    return found


def _assigned_names(statement: cst.BaseStatement) -> List[str]:
    names: List[str] = []
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            targets = []
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
                targets = [small.target]
            for target in targets:
                names.extend(_names_in(target) if not isinstance(target, cst.Name) else [target.value])
    return names


def _is_assignment_line(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)) for small in statement.body
    )


class TorchAmpRules:
    """Finds GradScalers and their training steps in one module and plans the rewrite."""

    def __init__(self, facts: ModuleFacts, exact: bool) -> None:
        self.facts = facts
        self.exact = exact
        self.plan = Plan()
        self._step_method_uses: List[cst.Name] = []
        self.step_statements: Set[cst.CSTNode] = set()
        self.backward_statements: Set[cst.CSTNode] = set()
        self._rewritten_constructors: Set[cst.Call] = set()
        self._dropped_imports: Set[int] = set()

    # ------------------------------------------------------------------ entry point
    def run(self) -> Plan:
        scalers = self._find_scalers()
        for call, statement in scalers:
            self._plan_scaler(call, statement)
        self._reject_untracked_backwards()
        self._drop_unused_scaler_imports()
        for access in self._step_method_uses:
            if self.facts.statement_of(access) not in self.step_statements:
                raise Blocked(access, "RPM104", "scaler.unscale_/step/update outside a training "
                              "step the migration recognised; migrate this loop by hand")
        return self.plan

    def _reject_untracked_backwards(self) -> None:
        """``x.scale(loss).backward()`` whose ``x`` was not followed from a torch GradScaler
        (e.g. a function nobody in this file calls): not certain, so the file is left alone.
        Objects built by a known non-torch call are someone else's and are ignored."""
        pattern = m.Call(func=m.Attribute(
            value=m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("scale"))), attr=m.Name("backward")))
        for call in self.facts.backward_calls:
            if not m.matches(call, pattern):
                continue
            statement = self.facts.statement_of(call)
            if statement in self.backward_statements:
                continue
            owner = call.func.value.func.value
            scope = self.facts.scope(owner)
            assignments = list(scope[owner.value]) if scope is not None else []
            built_elsewhere = all(
                not isinstance(a.node, cst.Param) and self._built_by_other_call(a.node)
                for a in assignments
            )
            if assignments and built_elsewhere:
                continue
            raise Blocked(call, "RPM104", f"`{owner.value}.scale(...).backward()` uses a scaler the "
                          "migration cannot follow back to a torch GradScaler in this file "
                          "(e.g. a function nobody here calls); migrate it by hand")

    def _built_by_other_call(self, node: cst.CSTNode) -> bool:
        statement = self.facts.statement_of(node) if isinstance(node, cst.CSTNode) else None
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        return isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and \
            self.facts.scaler_kind(small.value) is None and bool(self.facts.qualified(small.value.func))

    def _find_scalers(self) -> List[Tuple[cst.Call, cst.SimpleStatementLine]]:
        found = []
        facts = self.facts

        class Find(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                try:
                    kind = facts.scaler_kind(call)
                except ValueError:
                    raise Blocked(call, "RPM104", "GradScaler import fallback mixes torch.amp and "
                                  "torch.cuda.amp with positional arguments; pass them by keyword")
                if kind is not None:
                    found.append((call, facts.statement_of(call)))

        facts.module.visit(Find())
        return found

    # -------------------------------------------------------------- the scaler itself
    def _plan_scaler(self, call: cst.Call, statement: cst.BaseStatement) -> None:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if not (
            len(getattr(statement, "body", ())) == 1
            and isinstance(small, cst.Assign)
            and small.value is call
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
        ):
            raise Blocked(call, "RPM105", "GradScaler is not assigned to a plain variable "
                          "(attribute, container or expression); migrate this one by hand")
        name = statement.body[0].targets[0].target.value
        kind = self.facts.scaler_kind(call)
        self._rewrite_constructor(call, kind)
        scope = self.facts.scope(statement.body[0])
        self._follow_scaler(name, scope, depth=0)

    def _rewrite_constructor(self, call: cst.Call, kind) -> None:
        def build(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            if kind.implied_device is not None:  # legacy wrappers: init_scale comes first
                device = cst.Arg(cst.SimpleString(f'"{kind.implied_device}"'))
                if args:
                    device = device.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                args.insert(0, device)
            return updated.with_changes(func=cst.parse_expression("roundpipe.GradScaler"), args=args)

        self.plan.edits.replace_expression(call, build)
        self._rewritten_constructors.add(call)
        self.plan.rewrites.append((call, "GradScaler -> roundpipe.GradScaler"))

    def _follow_scaler(self, name: str, scope, depth: int) -> None:
        """Check every use of the scaler variable; plan each training step it drives."""
        if depth > 4:
            raise Blocked(scope.node, "RPM104", "GradScaler passed through too many functions")
        for access in self.facts.accesses(name, scope):
            parent = self.facts.parent(access)
            if isinstance(parent, cst.Attribute) and parent.value is access:
                method = parent.attr.value
                if method == "scale":
                    self._plan_backward(access, name)
                elif method in ("unscale_", "step", "update"):
                    self._step_method_uses.append(access)
                elif method in ("get_scale", "state_dict", "load_state_dict", "is_enabled",
                                "get_growth_factor", "get_backoff_factor", "get_growth_interval",
                                "set_growth_factor", "set_backoff_factor", "set_growth_interval"):
                    continue
                else:
                    raise Blocked(access, "RPM104", f"GradScaler method {method!r} is not migrated")
            elif isinstance(parent, cst.Arg):
                self._follow_into_function(parent, name, depth)
            else:
                raise Blocked(access, "RPM105", "GradScaler is stored or passed in a way the "
                              "migration cannot follow; migrate this one by hand")

    def _follow_into_function(self, arg: cst.Arg, name: str, depth: int) -> None:
        call = self.facts.parent(arg)
        function = self._local_function(call)
        if function is None:
            raise Blocked(arg, "RPM104", "GradScaler passed to a function defined elsewhere; "
                          "training steps spread over several files are not migrated")
        param = self._parameter_for(call, function, arg)
        self._follow_scaler(param, self.facts.scope(function.body.body[0]), depth + 1)

    def _local_function(self, call: cst.CSTNode) -> Optional[cst.FunctionDef]:
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name):
            return None
        scope = self.facts.scope(call)
        if scope is None:
            return None
        for assignment in scope[call.func.value]:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.FunctionDef):
                return node
        return None

    def _parameter_for(self, call: cst.Call, function: cst.FunctionDef, arg: cst.Arg) -> str:
        names = [p.name.value for p in function.params.params]
        if arg.keyword is not None:
            return arg.keyword.value
        index = list(call.args).index(arg)
        if arg.star or index >= len(names):
            raise Blocked(arg, "RPM104", "GradScaler passed through *args; migrate by hand")
        return names[index]

    # ------------------------------------------------- optimizer -> model binding
    def _binding(self, name: str, at: cst.CSTNode) -> Binding:
        scope = self.facts.scope(at)
        assignments = list(scope[name]) if scope is not None else []
        if not assignments:
            raise Blocked(at, "RPM108", f"{name!r} is not defined in this file")
        # the binding that reaches `at`: the last one before it, else (a loop) the last one
        before = [a for a in assignments if self.facts.order(a.node) < self.facts.order(at)]
        assignment = max(before or assignments, key=lambda a: self.facts.order(a.node))
        node = assignment.node
        if isinstance(node, cst.Param):
            return Binding(assignment.scope, name, None, None)
        if not isinstance(node, cst.CSTNode) or isinstance(node, (cst.Import, cst.ImportFrom)):
            raise Blocked(at, "RPM108", f"{name!r} is not built in this file")
        statement = self.facts.statement_of(node)
        value = None
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                value = small.value
        return Binding(assignment.scope, name, statement, value)

    def _caller_binding(self, binding: Binding, at: cst.CSTNode, depth: int = 0) -> Binding:
        """Follow a function parameter to the one binding every same-file caller passes."""
        function = self.facts.function_of(binding.scope)
        if function is None or depth > 4:
            raise Blocked(at, "RPM108", f"cannot follow {binding.name!r} to where it is built")
        sites = self.facts.call_sites(function)
        if not sites:
            raise Blocked(function, "RPM108", f"{function.name.value}() is not called in this "
                          "file; its model/optimizer cannot be followed")
        found: Optional[Binding] = None
        for site in sites:
            value = argument_for(site, function, binding.name)
            if not isinstance(value, cst.Name):
                raise Blocked(site, "RPM108", f"{binding.name!r} is not passed as a plain name")
            outer = self._binding(value.value, site)
            if outer.statement is None:
                outer = self._caller_binding(outer, site, depth + 1)
            if found is not None and outer.statement is not found.statement:
                raise Blocked(site, "RPM107", f"{function.name.value}() is called with different "
                              f"objects for {binding.name!r}")
            found = outer
        return found

    def _constructed(self, name: str, at: cst.CSTNode) -> Binding:
        binding = self._binding(name, at)
        if binding.statement is None:
            binding = self._caller_binding(binding, at)
        return binding

    # ------------------------------------------------------------ imports
    def _drop_unused_scaler_imports(self) -> None:
        """Remove ``GradScaler`` from imports whose every use was a rewritten constructor
        (so migrated scripts keep no dead torch import)."""
        for call in self._rewritten_constructors:
            if not isinstance(call.func, cst.Name):
                continue
            name = call.func.value
            scope = self.facts.scope(call)
            assignments = list(scope[name]) if scope is not None else []
            if not assignments or not all(isinstance(a.node, cst.ImportFrom) for a in assignments):
                continue
            uses = [r.node for a in assignments for r in a.references]
            if not all(self._is_rewritten_constructor(use) for use in uses):
                continue
            for assignment in assignments:
                self._drop_import_name(assignment.node, name)

    def _is_rewritten_constructor(self, node: cst.CSTNode) -> bool:
        parent = self.facts.parent(node)
        return isinstance(parent, cst.Call) and parent.func is node and parent in self._rewritten_constructors

    def _drop_import_name(self, statement: cst.ImportFrom, name: str) -> None:
        if id(statement) in self._dropped_imports:
            return
        self._dropped_imports.add(id(statement))
        names = statement.names if isinstance(statement.names, (list, tuple)) else []
        kept = [a for a in names if (a.evaluated_alias or a.evaluated_name) != name]
        line = self.facts.parent(statement)
        if kept and isinstance(line, cst.SimpleStatementLine):
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            self.plan.edits.replace_expression(
                statement, lambda updated: updated.with_changes(names=kept))
        elif isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            self._drop(line)

    def _drop(self, statement: cst.SimpleStatementLine) -> None:
        """Remove an import line; an import guard left empty goes too, another block gets
        ``pass``."""
        block = self.facts.parent(statement)
        body = list(block.body)
        guard = self.facts.parent(block)
        if len(body) == 1 and self._import_guard(guard):
            self._drop_statement(guard)
            return
        if isinstance(block, cst.IndentedBlock) and len(body) == 1:
            keep = cst.parse_statement("pass\n")
            self.plan.edits.replace_range(block, 0, 1,
                                          lambda updated: [keep.with_changes(leading_lines=updated[0].leading_lines)])
        else:
            self._drop_statement(statement)

    def _drop_statement(self, statement: cst.BaseStatement) -> None:
        block = self.facts.parent(statement)
        index = list(block.body).index(statement)
        self.plan.edits.replace_range(block, index, index + 1, drop_keeping_comments)

    @staticmethod
    def _import_guard(node: Optional[cst.CSTNode]) -> bool:
        """A ``try`` whose handlers only catch a failed import, with no else/finally."""
        if not isinstance(node, cst.Try) or node.orelse is not None or node.finalbody is not None:
            return False
        names = []
        for handler in node.handlers:
            kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
            names += [code(k.value if isinstance(k, cst.Element) else k) for k in kinds if k is not None]
        return bool(names) and all(n in ("ImportError", "ModuleNotFoundError") for n in names)

    # -------------------------------------------------------------- training steps
    def _plan_backward(self, access: cst.Name, scaler: str) -> None:
        scale_call = self.facts.parent(self.facts.parent(access))
        backward_attr = self.facts.parent(scale_call)
        backward_call = self.facts.parent(backward_attr)
        statement = self.facts.statement_of(access)
        if not (
            isinstance(scale_call, cst.Call)
            and isinstance(backward_attr, cst.Attribute)
            and backward_attr.attr.value == "backward"
            and isinstance(backward_call, cst.Call)
            and _only_expression(statement) is backward_call
        ):
            raise Blocked(access, "RPM106", "scaler.scale(...) is not used as "
                          "`scaler.scale(loss).backward()` on its own line")
        for arg in backward_call.args:
            if arg.keyword is not None and arg.keyword.value == "create_graph":
                raise Blocked(backward_call, "RPM103", "backward(create_graph=True) (higher-order "
                              "gradients) has no RoundPipe form; left untouched")
            raise Blocked(backward_call, "RPM106", "backward() with arguments is not migrated")
        if len(scale_call.args) != 1:
            raise Blocked(scale_call, "RPM106", "scaler.scale() of several outputs is not migrated")
        step = StepBuilder(self, scaler, statement, scale_call.args[0].value)
        step.plan()


class StepBuilder:
    """Recognises one training step around ``scaler.scale(loss).backward()`` and plans it."""

    def __init__(self, rules: TorchAmpRules, scaler: str, backward: cst.SimpleStatementLine,
                 loss: cst.BaseExpression) -> None:
        self.rules = rules
        self.facts = rules.facts
        self.scaler = scaler
        self.anchor = scaler  # the name whose next use after the backward starts the step
        self.backward = backward
        self.loss = loss
        rules.backward_statements.add(backward)
        self.block = self.facts.parent(backward)
        if not isinstance(self.block, (cst.IndentedBlock, cst.Module)):
            raise Blocked(backward, "RPM106", "backward is not a statement of a block")
        self.body = list(self.block.body)
        self.index = self.body.index(backward)

    # ---------------------------------------------------------------------- plan
    def plan(self) -> None:
        group_block, group_start, group_end, group, condition = self._find_step_group()
        optimizer = self._optimizer_of(group)
        model = self._model_for(optimizer)
        region = self._forward_region(model, optimizer)
        zero_grads = self._zero_grads_to_move(region, optimizer, model, condition)
        self._plan_forward(region, model)
        self._plan_step_group(group_block, group_start, group_end, group, optimizer, model, zero_grads)

    # ------------------------------------------------------------ the step group
    def _classify(self, statement: cst.BaseStatement) -> Optional[str]:
        value = _only_expression(statement)
        if not isinstance(value, cst.Call):
            return None
        s = self.scaler
        if _method_call(value, s, "unscale_"):
            return "unscale"
        if _method_call(value, s, "step"):
            return "step"
        if _method_call(value, s, "update"):
            return "update"
        if self.facts.calls_any(value, CLIP_FUNCTIONS):
            return "clip"
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("zero_grad")))):
            return "zero_grad"
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("step")))):
            owner = value.func.value.value
            if self._is_scheduler(owner, statement):
                return "scheduler"
        return None

    def _is_scheduler(self, name: str, at: cst.CSTNode) -> bool:
        binding = self.rules._binding(name, at)
        if binding.value is not None and isinstance(binding.value, cst.Call):
            return self.facts.calls_prefix(binding.value, [LR_SCHEDULER_PREFIX])
        return "sched" in name.lower()

    def _find_step_group(self):
        """(block, start, end, statements, condition) of the optimizer step statements: the
        first contiguous run of step statements after the backward, in this block or in the
        body of an ``if`` (gradient accumulation) that follows it."""
        for position in range(self.index + 1, len(self.body)):
            statement = self.body[position]
            found = self._step_run(self.block, self.body, position)
            if found is not None:
                return (*found, None)
            if isinstance(statement, cst.If) and self._mentions(statement, self.anchor):
                if statement.orelse is not None:
                    raise Blocked(statement, "RPM106", "conditional optimizer step with an else branch")
                inner = list(statement.body.body)
                for inner_position in range(len(inner)):
                    found = self._step_run(statement.body, inner, inner_position)
                    if found is not None:
                        return (*found, statement)
            if self._mentions(statement, self.anchor):
                break
        raise Blocked(self.backward, "RPM106", "no optimizer step (`scaler.step(optimizer)` + "
                      "`scaler.update()`, or apex's `optimizer.step()`) follows the backward in "
                      "the same block")

    def _step_run(self, block, statements, start):
        if self._classify(statements[start]) is None:
            return None
        end = start
        while end < len(statements) and self._classify(statements[end]) is not None:
            end += 1
        return block, start, end, statements[start:end]

    @staticmethod
    def _mentions(node: cst.CSTNode, name: str) -> bool:
        return name in _names_in(node)

    def _optimizer_of(self, group: List[cst.BaseStatement]) -> str:
        kinds = [self._classify(s) for s in group]
        if kinds.count("step") != 1 or kinds.count("update") != 1:
            raise Blocked(group[0], "RPM107", "the step must call scaler.step() and "
                          "scaler.update() once each (several optimizers are not migrated)")
        if kinds.index("update") < kinds.index("step"):
            raise Blocked(group[0], "RPM106", "scaler.update() before scaler.step()")
        step_call = _only_expression(group[kinds.index("step")])
        if len(step_call.args) != 1 or not isinstance(step_call.args[0].value, cst.Name):
            raise Blocked(step_call, "RPM102" if len(step_call.args) > 1 else "RPM106",
                          "scaler.step() with extra arguments (e.g. a closure) is not migrated")
        optimizer = step_call.args[0].value.value
        for statement, kind in zip(group, kinds):
            call = _only_expression(statement)
            if kind == "unscale" and not m.matches(call.args[0].value if call.args else None, m.Name(optimizer)):
                raise Blocked(call, "RPM107", "unscale_() of another optimizer")
        return optimizer

    def _model_for(self, optimizer: str) -> str:
        """The model's name in the step's scope; plans the wrap and the optimizer rewrite."""
        built = self.rules._constructed(optimizer, self.backward)
        if not isinstance(built.value, cst.Call):
            raise Blocked(built.statement or self.backward, "RPM108",
                          f"optimizer {optimizer!r} is not built by a call in this file")
        parameter_calls = []

        class FindParameters(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                if m.matches(call, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("parameters")), args=[])):
                    parameter_calls.append(call)

        built.value.visit(FindParameters())
        owners = {call.func.value.value for call in parameter_calls}
        if len(owners) != 1:
            raise Blocked(built.value, "RPM108", "the optimizer is not built on "
                          "`model.parameters()` of one model (parameter groups of submodules "
                          "cannot be mapped to RoundPipe's optimizer copies)")
        model_outer = owners.pop()
        model_built = self.rules._binding(model_outer, built.statement)
        self._reject_parallel(model_outer, built)
        self._plan_wrap(built, model_outer, parameter_calls)
        return self._local_name_for(model_outer, built, model_built)

    def _reject_parallel(self, model: str, built: Binding) -> None:
        for node in self.facts.assignments(model, built.scope):
            statement = self.facts.statement_of(node)

            class FindParallel(cst.CSTVisitor):
                def visit_Call(inner, call: cst.Call) -> None:  # noqa: N805
                    if self.facts.calls_any(call, PARALLEL_WRAPPERS):
                        raise Blocked(call, "RPM101", "DistributedDataParallel/DataParallel "
                                      "model: RoundPipe manages devices itself; left untouched")

            statement.visit(FindParallel())

    def _local_name_for(self, model_outer: str, built: Binding, model_built: Binding) -> str:
        """The name under which the step's scope sees the model."""
        step_scope = self.facts.scope(self.backward)
        if step_scope is built.scope:
            return model_outer
        function = self.facts.function_of(step_scope)
        if function is not None:
            for param in function.params.params:
                try:
                    outer = self.rules._caller_binding(Binding(step_scope, param.name.value, None, None), function)
                except Blocked:
                    continue
                if outer.name == model_outer and outer.scope is built.scope:
                    self._wrapped_parameter(function, param.name.value)
                    return param.name.value
        return model_outer

    def _wrapped_parameter(self, function: cst.FunctionDef, name: str) -> None:
        self.rules.plan.wrapped_models.append((self.facts.scope(function.body.body[0]), name, 0))

    def _plan_wrap(self, built: Binding, model: str, parameter_calls: List[cst.Call]) -> None:
        plan = self.rules.plan
        for call in parameter_calls:
            plan.edits.replace_expression(
                call.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
            )
        if id(built.statement) in plan.wrapped_optimizers:
            return
        plan.wrapped_optimizers.add(id(built.statement))
        block = self.facts.parent(built.statement)
        index = list(block.body).index(built.statement)
        wrap = cst.parse_statement(
            f"{model} = roundpipe.RoundPipe({model}, model_run_config="
            f"roundpipe.RoundPipeRunConfig(num_microbatch={NUM_MICROBATCH}))\n"
        )
        plan.edits.insert_before(block, index, [wrap])
        plan.rewrites.append((built.statement, f"wrapped {model} with roundpipe.RoundPipe; "
                              "optimizer built on model.optim_parameters()"))
        plan.wrapped_models.append((built.scope, model, self.facts.order(built.statement)))

    # ---------------------------------------------------------- forward region
    def _zero_grad_call(self, statement: cst.BaseStatement, optimizer: str, model: str) -> bool:
        call = _only_expression(statement)
        return call is not None and (
            _method_call(call, optimizer, "zero_grad") or _method_call(call, model, "zero_grad")
        )

    def _forward_region(self, model: str, optimizer: str) -> "ForwardRegion":
        end = self.index
        while end > 0 and self._zero_grad_call(self.body[end - 1], optimizer, model):
            end -= 1  # zero_grad() between loss and backward: moved into the step function
        self.zero_before_backward = list(range(end, self.index))
        if end == 0:
            raise Blocked(self.backward, "RPM106", "no forward pass before the backward")
        previous = self.body[end - 1]
        if isinstance(previous, cst.With):
            if not all(self.facts.is_autocast(item) for item in previous.items):
                raise Blocked(previous, "RPM106", "forward inside a `with` block that is not autocast")
            inner = list(previous.body.body)
            start = self._model_statement(inner, model, previous)
            return ForwardRegion(previous.body, inner, start, len(inner), previous, end - 1)
        start = self._model_statement(self.body[:end], model, self.backward)
        return ForwardRegion(self.block, self.body, start, end, None, start)

    def _model_statement(self, statements: List[cst.BaseStatement], model: str, at: cst.CSTNode) -> int:
        position = len(statements) - 1
        while position >= 0 and _is_assignment_line(statements[position]):
            if self._model_calls(statements[position], model):
                return position
            position -= 1
        raise Blocked(at, "RPM106", f"the forward pass (a call of {model!r} followed only by "
                      "assignments computing the loss) was not found before the backward")

    @staticmethod
    def _model_calls(statement: cst.CSTNode, model: str) -> List[cst.Call]:
        calls: List[cst.Call] = []

        class Find(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                if m.matches(call.func, m.Name(model)):
                    calls.append(call)

        statement.visit(Find())
        return calls

    def _zero_grads_to_move(self, region: "ForwardRegion", optimizer: str, model: str,
                            condition: Optional[cst.If]) -> List[int]:
        """Indices in this block of `optimizer/model.zero_grad()` before the backward (at the
        top of the iteration, or between loss and backward): they move to the step's end."""
        found = [p for p in range(region.outer_index) if self._zero_grad_call(self.body[p], optimizer, model)]
        found += self.zero_before_backward
        if found and condition is not None:
            raise Blocked(self.body[found[0]], "RPM106", "zero_grad() every iteration but a "
                          "conditional optimizer step; not certain, left untouched")
        return found

    # ------------------------------------------------------------- emit: forward
    def _plan_forward(self, region: "ForwardRegion", model: str) -> None:
        statements = region.statements[region.start:region.end]
        model_calls = [c for s in statements for c in self._model_calls(s, model)]
        if len(model_calls) != 1:
            raise Blocked(statements[0], "RPM107", f"{model!r} is called {len(model_calls)} times "
                          "in the forward; not migrated")
        model_call = model_calls[0]
        first = statements[0]
        output_name, drop_first = self._output_binding(first, model_call)
        assigned = {n for s in statements for n in _assigned_names(s)}
        loss_name = self.loss.value if isinstance(self.loss, cst.Name) else None
        later = self.body[self.index + 1:]
        used_later = {n for s in later for n in _names_in(s)}
        leaking = (assigned - {loss_name, output_name}) & used_later
        if leaking:
            raise Blocked(first, "RPM106", f"values computed in the forward ({', '.join(sorted(leaking))}) "
                          "are used after the step; not migrated")
        return_outputs = output_name is not None and output_name in used_later
        labels = self._labels(region, statements, model_call, assigned)
        input_args, input_kwargs = self._inputs(model_call)
        sum_reduced = self._sum_reduced(statements)
        self._emit_forward(region, statements, model_call, output_name, drop_first, labels,
                           input_args, input_kwargs, loss_name, return_outputs, sum_reduced, model)

    def _sum_reduced(self, statements: List[cst.BaseStatement]) -> bool:
        """The loss sums over the batch (``reduction="sum"`` in it or in its criterion):
        then per-microbatch losses already add up and are not divided."""
        def says_sum(node: cst.CSTNode) -> bool:
            return bool(m.findall(node, m.Arg(keyword=m.Name("reduction"),
                                              value=m.SimpleString('"sum"') | m.SimpleString("'sum'"))))

        for statement in statements:
            if says_sum(statement):
                return True
            for call in m.findall(statement, m.Call(func=m.Name())):
                try:
                    binding = self.rules._binding(call.func.value, statement)
                except Blocked:
                    continue
                if binding.value is not None and says_sum(binding.value):
                    return True
        return False

    def _output_binding(self, first: cst.BaseStatement, model_call: cst.Call) -> Tuple[Optional[str], bool]:
        small = first.body[0] if isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1 else None
        if isinstance(small, cst.Assign) and small.value is model_call and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                return target.value, True
        return None, False

    def _batch_names(self, region: "ForwardRegion") -> Set[str]:
        """Names holding this iteration's data: the loop target and everything assigned in
        the loop body before the forward; without a loop, the function's parameters. A
        loss input among them is a label (split with the microbatches); anything else the
        loss reads is captured by the loss function as it is."""
        loop = self.facts.enclosing(self.backward, (cst.For, cst.While, cst.FunctionDef))
        names: Set[str] = set()
        if isinstance(loop, (cst.For, cst.While)):
            if isinstance(loop, cst.For):
                names |= set(_names_in(loop.target))
            earlier = self.body[: region.outer_index]
            if region.with_statement is not None:
                earlier = earlier + region.statements[: region.start]
            for statement in earlier:
                if _is_assignment_line(statement):
                    names |= set(_assigned_names(statement))
        elif isinstance(loop, cst.FunctionDef):
            names |= {p.name.value for p in loop.params.params}
        return names

    def _labels(self, region, statements, model_call, assigned) -> List[str]:
        batch = self._batch_names(region)
        free: List[str] = []
        for statement in statements:
            for name in _names_in(statement):
                if name in batch and name not in assigned and name not in free:
                    free.append(name)
        inputs = set(_names_in(model_call))
        return [n for n in free if n not in inputs or self._used_outside_call(statements, model_call, n)]

    def _used_outside_call(self, statements, model_call, name) -> bool:
        total = sum(_names_in(s).count(name) for s in statements)
        return total > _names_in(model_call).count(name)

    @staticmethod
    def _inputs(model_call: cst.Call) -> Tuple[List[cst.BaseExpression], object]:
        args, kwargs, star_kwargs = [], [], None
        for arg in model_call.args:
            if arg.star == "*":
                raise Blocked(model_call, "RPM106", "model called with *args; not migrated")
            if arg.star == "**":
                star_kwargs = arg.value
            elif arg.keyword is not None:
                kwargs.append((arg.keyword.value, arg.value))
            else:
                args.append(arg.value)
        if star_kwargs is not None and kwargs:
            raise Blocked(model_call, "RPM106", "model called with **kwargs and keywords; not migrated")
        return args, (star_kwargs if star_kwargs is not None else kwargs)

    def _emit_forward(self, region, statements, model_call, output_name, drop_first, labels,
                      input_args, input_kwargs, loss_name, return_outputs, sum_reduced, model) -> None:
        plan = self.rules.plan
        loss_fn = self._fresh("_loss_fn")
        out_param = output_name or "_outputs"
        label_param = labels[0] if len(labels) == 1 else ("_labels" if labels else "_label")
        if output_name is None:
            plan.edits.replace_expression(model_call, lambda _: cst.Name(out_param))
        loss_value = code(self.loss)
        divisor = "" if sum_reduced else f" / {NUM_MICROBATCH}"
        scaler = self.scaler
        head = ""
        if len(labels) > 1:
            head = f"    {', '.join(labels)} = _labels\n"
        argument_text = ", ".join(code(a) for a in input_args)
        if len(input_args) == 1:
            argument_text += ","
        kwargs_text = ""
        if isinstance(input_kwargs, list) and input_kwargs:
            kwargs_text = ", input_kwargs={" + ", ".join(f'"{k}": {code(v)}' for k, v in input_kwargs) + "}"
        elif not isinstance(input_kwargs, list):
            kwargs_text = f", input_kwargs={code(input_kwargs)}"
        label_text = ""
        if labels:
            label_text = f", label={labels[0]}" if len(labels) == 1 else f", label=({', '.join(labels)})"
        outputs_text = ", return_outputs=True" if return_outputs else ""
        target = loss_name or "_loss"
        call_text = (f"{model}.forward_backward(input_args=({argument_text}){kwargs_text}"
                     f"{label_text}, loss_fn={loss_fn}{outputs_text})")
        if return_outputs:
            forward_lines = [f"{target}, {output_name} = {call_text}\n",
                             f"{target} = {target} / {scaler}.get_scale()\n"]
        else:
            forward_lines = [f"{target} = {call_text} / {scaler}.get_scale()\n"]
        keep_from = 1 if drop_first else 0
        indent = "    "

        def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
            body_statements = updated[keep_from:]
            definition = cst.parse_statement(
                f"def {loss_fn}({out_param}, {label_param}):\n{head}{indent}pass\n"
            )
            returned = cst.parse_statement(f"return {scaler}.scale({loss_value}){divisor}\n")
            inner = list(definition.body.body[:-1]) + list(body_statements) + [returned]
            definition = definition.with_changes(body=definition.body.with_changes(body=inner))
            definition = carry_comments(updated[:keep_from], definition)
            calls = [cst.parse_statement(line) for line in forward_lines]
            return [definition, *calls]

        plan.edits.replace_range(region.block, region.start, region.end, build)
        plan.rewrites.append((statements[0], "forward + loss -> model.forward_backward(loss_fn=...)"))

    def _fresh(self, base: str) -> str:
        used = self.facts.all_names | self.rules.plan.helper_names
        name = base
        counter = 2
        while name in used:
            name = f"{base}_{counter}"
            counter += 1
        self.rules.plan.helper_names.add(name)
        return name

    # ------------------------------------------------------------- emit: step
    def _plan_step_group(self, group_block, group_start, group_end, group, optimizer, model,
                         zero_grads: List[int]) -> None:
        plan = self.rules.plan
        step_fn = self._fresh("_step_fn")
        kinds = [self._classify(s) for s in group]
        self._group_edits(group, kinds, optimizer, model)
        moved_zero = None
        if zero_grads:
            zero_call = _only_expression(self.body[zero_grads[0]])
            arguments = ", ".join(code(a).rstrip(", ") for a in zero_call.args)
            moved_zero = cst.parse_statement(f"{optimizer}.zero_grad({arguments})\n")
        step_suffix = ", is_async=False" if self.rules.exact else ""

        def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
            inside, update = self._step_body(updated, kinds, optimizer)
            if moved_zero is not None:
                inside.append(moved_zero)
            definition = cst.parse_statement(f"def {step_fn}():\n    pass\n")
            definition = definition.with_changes(
                leading_lines=inside[0].leading_lines,
                body=definition.body.with_changes(body=[inside[0].with_changes(leading_lines=()), *inside[1:]]),
            )
            step = cst.parse_statement(f"{model}.step({step_fn}{step_suffix})\n")
            return [definition, step, update]

        plan.edits.replace_range(group_block, group_start, group_end, build)
        for index in zero_grads:
            plan.edits.replace_range(self.block, index, index + 1, drop_keeping_comments)
        plan.edits.replace_range(self.block, self.index, self.index + 1, drop_keeping_comments)
        self.rules.step_statements.update(group)
        plan.rewrites.append((group[0], "optimizer step -> model.step(step_fn); scaler.update() kept"))

    def _group_edits(self, group, kinds, optimizer: str, model: str) -> None:
        """Expression edits inside the step statements: clipping on the optimizer copies,
        ``model.zero_grad`` through the optimizer (whose parameters are the copies)."""
        for statement, kind in zip(group, kinds):
            if kind == "clip":
                self._clip_on_copies(statement, model)
            if kind == "zero_grad":
                call = _only_expression(statement)
                if call.func.value.value == model:
                    self.rules.plan.edits.replace_expression(call.func.value, lambda _: cst.Name(optimizer))

    def _update_statement(self, original: Optional[cst.BaseStatement]) -> cst.BaseStatement:
        """``scaler.update()`` for the main thread (``is_async=False`` with --exact)."""
        if original is not None and (not self.rules.exact or _only_expression(original).args):
            return original
        text = f"{self.scaler}.update(is_async=False)\n" if self.rules.exact else f"{self.scaler}.update()\n"
        update = cst.parse_statement(text)
        if original is not None:
            update = update.with_changes(leading_lines=original.leading_lines,
                                         trailing_whitespace=original.trailing_whitespace)
        return update

    def _step_body(self, updated, kinds, optimizer: str):
        """(statements for the step function, the update statement) from the step group."""
        update_index = kinds.index("update")
        inside = [s for i, s in enumerate(updated) if i != update_index]
        return inside, self._update_statement(updated[update_index])

    def _clip_on_copies(self, statement: cst.BaseStatement, model: str) -> None:
        call = _only_expression(statement)

        class Find(cst.CSTVisitor):
            def __init__(inner) -> None:  # noqa: N805
                inner.found: List[cst.Call] = []

            def visit_Call(inner, node: cst.Call) -> None:  # noqa: N805
                if _method_call(node, model, "parameters"):
                    inner.found.append(node)

        finder = Find()
        call.visit(finder)
        for parameters in finder.found:
            self.rules.plan.edits.replace_expression(
                parameters.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
            )


@dataclass
class ForwardRegion:
    """Where the forward + loss statements are: ``statements[start:end]`` of ``block``."""

    block: cst.CSTNode
    statements: List[cst.BaseStatement]
    start: int
    end: int
    with_statement: Optional[cst.With]
    outer_index: int  # index in the backward's block of the first statement of the region


def plan_torch_amp(facts: ModuleFacts, exact: bool) -> Tuple[Plan, TorchAmpRules]:
    """Plan the rewrite of every torch GradScaler training step in the module."""
    rules = TorchAmpRules(facts, exact)
    return rules.run(), rules


class ModelUses:
    """After wrapping: checkpoints go through the wrapped module (``model.model``) and the
    newest weights are synchronized into the model before evaluation or saving."""

    def __init__(self, rules: TorchAmpRules) -> None:
        self.rules = rules
        self.facts = rules.facts
        self._synced: Set[Tuple[int, int]] = set()  # (block, index) already given a sync

    def plan(self) -> None:
        seen: Set[Tuple[int, str]] = set()
        queue = list(self.rules.plan.wrapped_models)
        while queue:
            scope, name, after = queue.pop()
            if (id(scope), name) in seen:
                continue
            seen.add((id(scope), name))
            for access in self.facts.accesses(name, scope):
                if self.facts.order(access) <= after:
                    continue
                parent = self.facts.parent(access)
                if isinstance(parent, cst.Attribute) and parent.value is access:
                    self._plan_attribute(parent, access, name)
                elif isinstance(parent, cst.Call) and parent.func is access:
                    self._plan_inference_call(access, name)
                elif isinstance(parent, cst.Arg):
                    target = self._parameter_target(parent)
                    if target is not None:
                        queue.append(target)

    def _plan_attribute(self, attribute: cst.Attribute, access: cst.Name, name: str) -> None:
        method = attribute.attr.value
        if method in ("state_dict", "load_state_dict"):
            self.rules.plan.edits.replace_expression(
                attribute,
                lambda updated: updated.with_changes(
                    value=cst.Attribute(value=updated.value, attr=cst.Name("model"))
                ),
            )
        if method in ("eval", "state_dict"):
            self._synchronize_before(access, name)

    def _plan_inference_call(self, access: cst.Name, name: str) -> None:
        """A model call inside ``with torch.no_grad()``/``inference_mode()`` evaluates: the
        newest weights are synchronized into the model before that block."""
        for ancestor in self.facts.ancestors(access):
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and self.facts.calls_any(item.item, _NO_GRAD)
                for item in ancestor.items
            ):
                self._synchronize_before(ancestor, name)
                return

    def _parameter_target(self, arg: cst.Arg):
        call = self.facts.parent(arg)
        function = self.rules._local_function(call)
        if function is None:
            return None
        try:
            param = self.rules._parameter_for(call, function, arg)
        except Blocked:
            return None
        return self.facts.scope(function.body.body[0]), param, 0

    def _synchronize_before(self, node: cst.CSTNode, name: str) -> None:
        statement = self.facts.statement_of(node)
        block = self.facts.parent(statement)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return
        body = list(block.body)
        index = body.index(statement)
        earlier = [i for b, i in self._synced if b == id(block) and i <= index]
        if earlier and not any(self._trains(s) for s in body[max(earlier):index]):
            return  # already synchronized in this block, and no training since
        previous = _only_expression(body[index - 1]) if index > 0 else None
        if previous is not None and _method_call(previous, name, "synchronize"):
            return
        self._synced.add((id(block), index))
        self.rules.plan.edits.insert_before(block, index, [cst.parse_statement(f"{name}.synchronize()\n")])
        self.rules.plan.rewrites.append((statement, f"{name}.synchronize() before evaluation/saving"))

    @staticmethod
    def _trains(statement: cst.CSTNode) -> bool:
        """The statement may run a training step (a backward or an optimizer step)."""
        return bool(m.findall(statement, m.Call(func=m.Attribute(attr=m.Name("backward") | m.Name("step")))))
