"""Small questions about libcst statement shapes, shared by the rewrite rules."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, List, Optional, Sequence, Set, Tuple

import libcst as cst
import libcst.matchers as m

if TYPE_CHECKING:
    from .names import ModuleFacts

__all__ = [
    "is_docstring",
    "exclusive",
    "code",
    "method_call",
    "calls_method",
    "bare_method_call",
    "PARAMETERS_CALL",
    "only_expression",
    "only_assignment",
    "names_in",
    "assigned_names",
    "is_assignment_line",
    "is_import_line",
    "leading_lines",
    "is_plain_line",
    "written_and_read",
    "names_outside",
    "tests_presence",
    "dotted",
    "receiver",
    "statements_of",
]

_EMPTY = cst.Module([])


def code(node: cst.CSTNode) -> str:
    """The source text of ``node``."""
    return _EMPTY.code_for_node(node)


def method_call(node: cst.CSTNode, owner: str, method: str) -> bool:
    """``owner.method(...)`` with ``owner`` a plain name or a dotted one (``self.scaler``)."""
    return (
        calls_method(node, method)
        and isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and dotted(node.func.value) == owner
    )


def dotted(node: Optional[cst.CSTNode]) -> Optional[str]:
    """``"a"`` for the name ``a``, ``"a.b.c"`` for ``a.b.c``, ``'a["k"]'`` for ``a['k']`` (a
    plain string key, spelled one way whatever the quotes); None for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        owner = dotted(node.value)
        return f"{owner}.{node.attr.value}" if owner is not None else None
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        key = node.slice[0].slice.value
        owner = dotted(node.value)
        if owner is not None and isinstance(key, cst.SimpleString) and key.prefix.lower() in ("", "u"):
            return f"{owner}[{json.dumps(key.evaluated_value)}]"
    return None


def calls_method(node: cst.CSTNode, method: str) -> bool:
    """``<anything>.method(...)``."""
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == method


def bare_method_call(method: str) -> m.Call:
    """Matcher of ``name.method()``: a plain-name owner, no arguments."""
    return m.Call(func=m.Attribute(value=m.Name(), attr=m.Name(method)), args=[])


#: ``model.parameters()``: a plain-name owner's parameters, no arguments
PARAMETERS_CALL = bare_method_call("parameters")


def statements_of(suite: cst.BaseSuite) -> List[cst.BaseStatement]:
    """The statements of an indented block; none for a one-line body (``with x: y = f()``),
    whose small statements are no statements of their own."""
    return list(suite.body) if isinstance(suite, cst.IndentedBlock) else []


def receiver(call: cst.Call) -> Optional[cst.BaseExpression]:
    """``x`` of ``x.method(...)``; None for a call of anything but an attribute."""
    return call.func.value if isinstance(call.func, cst.Attribute) else None


def only_expression(statement: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The expression of a one-expression statement line, else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr):
            return small.value
    return None


def is_docstring(statement: cst.CSTNode) -> bool:
    """``statement`` is a line holding only a string (a docstring where it opens a body)."""
    return isinstance(only_expression(statement), (cst.SimpleString, cst.ConcatenatedString))


def only_assignment(statement: Optional[cst.CSTNode]) -> Optional[cst.Assign]:
    """The assignment of a statement line that holds one ``=`` assignment and nothing else
    (``a = f()``, ``a, b = f()``, ``a = b = f()``; not ``a = f(); b = 1``, ``a += 1`` or
    ``a: T = f()``), else None. Callers that need one target check ``targets`` themselves."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Assign):
            return small
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


def leading_lines(statement: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    """The blank and comment lines before ``statement`` (libcst declares them on the two
    kinds of statement, not on their base class)."""
    if isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        return statement.leading_lines
    return ()


def is_import_line(statement: cst.BaseStatement) -> bool:
    """A line of only ``import`` / ``from ... import`` statements."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def is_plain_line(statement: cst.BaseStatement) -> bool:
    """A line of assignments and expressions only (no return, break, del, import...)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Expr)) for small in statement.body
    )


def written_and_read(statement: cst.BaseStatement) -> Tuple[Set[str], Set[str]]:
    """(names a simple statement binds, names it reads): ``d[k] = v`` reads ``d``, ``k`` and
    ``v``; ``a, b = f(a)`` binds ``a``, ``b`` and reads ``f``, ``a``; ``n += 1`` does both."""
    written: Set[str] = set()
    read: Set[str] = set()

    def bind(target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            written.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                bind(element.value)
        elif isinstance(target, cst.StarredElement):
            bind(target.value)
        else:  # attribute or subscript: the object is read (and mutated)
            read.update(names_in(target))

    for small in getattr(statement, "body", ()):
        if isinstance(small, cst.Assign):
            for target in small.targets:
                bind(target.target)
            read.update(names_in(small.value))
        elif isinstance(small, cst.AugAssign):
            bind(small.target)
            read.update(names_in(small.target))
            read.update(names_in(small.value))
        elif isinstance(small, cst.AnnAssign):
            bind(small.target)
            if small.value is not None:
                read.update(names_in(small.value))
        else:
            read.update(names_in(small))
    return written, read


def names_outside(facts: "ModuleFacts", root: cst.CSTNode, skipped: Set[cst.CSTNode]) -> Set[str]:
    """Every plain name read or bound under ``root``, except under the ``skipped`` nodes."""
    found: Set[str] = set()

    def visit(node: cst.CSTNode) -> bool:
        if node in skipped:
            return False
        if isinstance(node, cst.Name):
            found.add(node.value)
        if isinstance(node, cst.Attribute):  # only its object: the attribute's name is no variable
            facts.walk(node.value, visit)
            return False
        return True

    facts.walk(root, visit)
    return found


def tests_presence(parent: Optional[cst.CSTNode], access: cst.BaseExpression) -> bool:
    """``access`` is only tested for being there: ``x is None``, ``x is not None`` or the
    test of an ``if``/``while``/conditional expression (``if x:``), possibly under ``not``."""
    if isinstance(parent, cst.Comparison):
        return (
            parent.left is access
            and len(parent.comparisons) == 1
            and m.matches(
                parent.comparisons[0], m.ComparisonTarget(operator=m.Is() | m.IsNot(), comparator=m.Name("None"))
            )
        )
    if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        return True
    return isinstance(parent, (cst.If, cst.While, cst.IfExp)) and parent.test is access


def exclusive(facts: "ModuleFacts", first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """``first`` and ``second`` are in different branches (body / else) of one ``if``."""
    for ancestor in facts.ancestors(first):
        if isinstance(ancestor, cst.If) and facts.within(second, ancestor):
            in_body = [facts.within(node, ancestor.body) for node in (first, second)]
            return in_body[0] != in_body[1]
    return False
