"""Small questions about libcst statement shapes, shared by the rewrite rules."""

from __future__ import annotations

from typing import List, Optional

import libcst as cst
import libcst.matchers as m

__all__ = ["code", "method_call", "only_expression", "names_in", "assigned_names", "is_assignment_line"]

_EMPTY = cst.Module([])


def code(node: cst.CSTNode) -> str:
    """The source text of ``node``."""
    return _EMPTY.code_for_node(node)


def method_call(node: cst.CSTNode, owner: str, method: str) -> bool:
    """``owner.method(...)`` with ``owner`` a plain name."""
    return m.matches(node, m.Call(func=m.Attribute(value=m.Name(owner), attr=m.Name(method))))


def only_expression(statement: cst.BaseStatement) -> Optional[cst.BaseExpression]:
    """The expression of a one-expression statement line, else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr):
            return small.value
    return None


def names_in(node: cst.CSTNode) -> List[str]:
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


def assigned_names(statement: cst.BaseStatement) -> List[str]:
    names: List[str] = []
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            targets = []
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
                targets = [small.target]
            for target in targets:
                names.extend(names_in(target) if not isinstance(target, cst.Name) else [target.value])
    return names


def is_assignment_line(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)) for small in statement.body
    )


