"""Migrate one file's source text: parse, apply the torch.amp and apex rules, check.

Entry point per file: :func:`migrate_source` (the command line and the tests); a set of
files that form one program goes through :func:`migrate.project.migrate_project`, which
calls it for each file and keeps the outcome consistent. It never raises for bad input: a
file that cannot be parsed comes back unchanged with an RPM9xx diagnostic, and a file
whose AMP use is not fully understood comes back unchanged with a diagnostic per blocker
saying why. It never imports torch.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Dict, List, Optional, Tuple

import libcst as cst

from .apex_amp import plan_apex
from .diagnostics import Diagnostic, FileResult, Rewrite
from .edits import EditApplier, EditConflict
from .foreign_functions import ForeignFunctions
from .header import add_header
from .model_uses import ModelUses
from .names import ModuleFacts
from .plan import Blocked
from .prefilter import SCALER_USE, might_use_a_scaler
from .scaler_wrapper import WrapperContext
from .state_helpers import StateHelpers
from .torch_amp import plan_torch_amp
from .wrapping import wrap_long_lines

__all__ = ["SCALER_USE", "migrate_source"]


def migrate_source(
    source: str,
    path: str = "<stdin>",
    exact: bool = False,
    force: bool = False,
    state_helpers: StateHelpers = MappingProxyType({}),
    wrappers: Optional[WrapperContext] = None,
    apex_target: str = "compat",
    foreign: ForeignFunctions = MappingProxyType({}),
) -> FileResult:
    """Return the migrated text of ``source`` with what was rewritten and what was not.

    Args:
        source: the file's text.
        path: used in diagnostics and the report only.
        exact: emit ``step(..., is_async=False)`` so the migrated script reproduces the
            original's numbers (the plain ``update()`` after it applies that step's result).
        force: analyse the file even when its text has no AMP marker (a project file that
            other given files import).
        state_helpers: the checkpoint helpers of other files this file calls, with their
            state-only parameters (:mod:`migrate.state_helpers`; the project layer finds them).
        wrappers: what the other files of the project say about the loss-scaler wrapper
            classes this file defines, builds or calls (see :mod:`migrate.scaler_wrapper`).
        apex_target: ``"compat"`` or ``"plain"`` (apex scripts written with upstream
            RoundPipe's API where their settings allow it: :mod:`migrate.apex_plain`).
        foreign: the functions of other given files this file calls, by call spelling
            (:mod:`migrate.foreign_functions`; gradient helpers among them move into the step).
    """
    result = FileResult(path=path, original=source, migrated=source)
    if not (force or might_use_a_scaler(source)):
        return result
    try:
        wrapper = cst.MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    except cst.ParserSyntaxError as err:
        result.diagnostics.append(
            Diagnostic(path, err.raw_line, err.raw_column + 1, "RPM901", f"syntax error, file skipped: {err.message}")
        )
        return result
    facts = ModuleFacts(wrapper)
    notes: List[Tuple[cst.CSTNode, str, str]] = []
    try:
        plan, rules = plan_torch_amp(facts, exact, state_helpers, wrappers, foreign)
        try:
            notes = plan_apex(facts, exact, plan, apex_target) if "apex" in source else []
            if not plan.blocked:
                ModelUses(rules).plan()
        except Blocked as blocked:
            plan.blocked.append(blocked)
        plan.blocked.extend(rules.attributes.unclaimed())  # a trainer's objects used from outside it
    except EditConflict:
        result.diagnostics.append(
            Diagnostic(
                path,
                1,
                1,
                "RPM116",
                "the rewrite would change the same statements twice (duplicated training code?); file left unchanged",
            )
        )
        return result
    if plan.blocked:
        result.diagnostics.extend(_blocker_diagnostics(path, facts, plan.blocked))
        return result
    if not plan.edits:
        return result
    edited = facts.module.visit(EditApplier(plan.edits, facts.ancestors))
    migrated = wrap_long_lines(add_header(edited, plan.microbatch, facts.names_under(edited)), source)
    try:
        compile(migrated, path, "exec")
    except SyntaxError as err:  # a bug in a rule: never write what does not compile
        result.diagnostics.append(
            Diagnostic(
                path,
                1,
                1,
                "RPM190",
                f"internal error, file left unchanged (please report): the migrated text does not compile: {err.msg}",
            )
        )
        return result
    result.migrated = migrated
    result.diagnostics.extend(
        Diagnostic(path, facts.line(node), facts.position(node).column + 1, code, text) for node, code, text in notes
    )
    result.rewrites = [Rewrite(facts.position(node).line, text) for node, text in plan.rewrites]
    result.rewrites.sort(key=lambda r: r.line)
    result.wrapped_models = sorted({name for _, name, _ in plan.wrapped_models})
    result.handed_classes = sorted(plan.handed_classes)
    return result


def _blocker_diagnostics(path: str, facts: ModuleFacts, blockers: List[Blocked]) -> List[Diagnostic]:
    """One diagnostic per blocker, at the node that blocks, in line order, duplicates dropped."""
    found: Dict[Tuple[int, int, str], Diagnostic] = {}
    for blocked in blockers:
        position = facts.position(blocked.node)
        key = (position.line, position.column + 1, blocked.code)
        found.setdefault(key, Diagnostic(path, *key, blocked.message))
    return [found[key] for key in sorted(found)]
