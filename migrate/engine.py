"""Migrate one file's source text: parse, apply the torch.amp and apex rules, check.

Entry point per file: :func:`migrate_source` (the command line and the tests); a set of
files that form one program goes through :func:`migrate.project.migrate_project`, which
calls it for each file and keeps the outcome consistent. It never raises for bad input: a
file that cannot be parsed comes back unchanged with an RPM9xx diagnostic, and a file
whose AMP use is not fully understood comes back unchanged with a diagnostic per blocker
saying why. It never imports torch.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import libcst as cst
import libcst.matchers as m

from .apex_amp import plan_apex
from .diagnostics import Diagnostic, FileResult, Rewrite
from .edits import EditApplier, EditConflict
from .model_uses import ModelUses
from .names import ModuleFacts
from .plan import Blocked, Plan
from .prefilter import might_use_amp
from .torch_amp import plan_torch_amp

__all__ = ["migrate_source"]

_MICROBATCH_NOTE = "  # roundpipe-migrate: microbatches per batch; mean losses are divided by it"


#: Uses of a scaler object whose construction is not in the file (``self.scaler.scale(loss)``,
#: ``loss_scaler.unscale_(opt)``): looked at too, so that such a file is named, not skipped.
SCALER_USE = re.compile(r"\.scale\(|\.unscale_\(|\bloss_scaler\b")


def migrate_source(source: str, path: str = "<stdin>", exact: bool = False, force: bool = False) -> FileResult:
    """Return the migrated text of ``source`` with what was rewritten and what was not.

    Args:
        source: the file's text.
        path: used in diagnostics and the report only.
        exact: emit ``step(..., is_async=False)`` so the migrated script reproduces the
            original's numbers (the plain ``update()`` after it applies that step's result).
        force: analyse the file even when its text has no AMP marker (a project file that
            other given files import).
    """
    result = FileResult(path=path, original=source, migrated=source)
    if not (force or might_use_amp(source) or SCALER_USE.search(source)):
        return result
    try:
        wrapper = cst.MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    except cst.ParserSyntaxError as err:
        result.diagnostics.append(
            Diagnostic(path, err.raw_line, err.raw_column + 1, "RPM901", f"syntax error, file skipped: {err.message}")
        )
        return result
    facts = ModuleFacts(wrapper)
    notes: List[Tuple[cst.CSTNode, str]] = []
    try:
        plan, rules = plan_torch_amp(facts, exact)
        try:
            notes = plan_apex(facts, exact, plan) if "apex" in source else []
            if not plan.blocked:
                ModelUses(rules).plan()
        except Blocked as blocked:
            plan.blocked.append(blocked)
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
    _add_header(facts.module, plan)
    migrated = facts.module.visit(EditApplier(plan.edits, facts.ancestors)).code
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
        Diagnostic(path, facts.line(node), facts.position(node).column + 1, "RPM302", text) for node, text in notes
    )
    result.rewrites = [Rewrite(facts.position(node).line, text) for node, text in plan.rewrites]
    result.rewrites.sort(key=lambda r: r.line)
    result.wrapped_models = sorted({name for _, name, _ in plan.wrapped_models})
    return result


def _blocker_diagnostics(path: str, facts: ModuleFacts, blockers: List[Blocked]) -> List[Diagnostic]:
    """One diagnostic per blocker, at the node that blocks, in line order, duplicates dropped."""
    found: Dict[Tuple[int, int, str], Diagnostic] = {}
    for blocked in blockers:
        position = facts.position(blocked.node)
        key = (position.line, position.column + 1, blocked.code)
        found.setdefault(key, Diagnostic(path, *key, blocked.message))
    return [found[key] for key in sorted(found)]


def _add_header(module: cst.Module, plan: Plan) -> None:
    """``import roundpipe`` and the microbatch constant at the end of the module's top import
    block (docstring, ``__future__`` and the imports before any other statement), so module
    code that runs before a later import already sees them; ``import roundpipe`` is not
    repeated when the top block has it."""
    body: List[cst.BaseStatement] = list(module.body)
    index = 0
    while index < len(body) and (_is_import_line(body[index]) or _is_docstring(body[index], index)):
        index += 1
    lines = [] if any(_imports_roundpipe(s) for s in body[:index]) else ["import roundpipe\n"]
    lines.append(f"{plan.microbatch} = 1{_MICROBATCH_NOTE}\n")
    plan.edits.insert_before(module, index, [cst.parse_statement(line) for line in lines])


def _imports_roundpipe(statement: cst.BaseStatement) -> bool:
    return m.matches(
        statement, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("roundpipe"), asname=None)])])
    )


def _is_import_line(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _is_docstring(statement: cst.BaseStatement, position: int) -> bool:
    return (
        position == 0
        and isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
