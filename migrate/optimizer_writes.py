"""Main-thread statements that write (or read) optimizer state.

In the asynchronous RoundPipe form the step function runs on the optimizer thread while the
main thread goes on; a learning-rate loop over ``optimizer.param_groups``, a scheduler step
outside the step function, ``add_param_group`` or a helper handed the optimizer
(``adjust_learning_rate(optimizer, epoch)``) and a ``zero_grad()`` left beside the step
(it clears the optimizer copies' gradients) would race with it. The rules order each of
them after the running step (``model.synchronize()`` before it); this module only finds them.
"""

from __future__ import annotations

from typing import Callable, List, Set

import libcst as cst
import libcst.matchers as m

__all__ = ["optimizer_writes"]


def optimizer_writes(root: cst.CSTNode, optimizer: str, is_scheduler: Callable[[str, cst.CSTNode], bool],
                     skipped: Set[cst.CSTNode], trainers: Set[str]) -> List[cst.BaseStatement]:
    """Statements under ``root`` (not inside nested functions or classes, nor under the
    ``skipped`` nodes) that touch the state of ``optimizer``, in source order: the outermost
    ``for`` over ``optimizer.param_groups``, or the line that assigns into it, calls one of
    its mutating methods, steps a scheduler or passes the optimizer to a call (other than
    a call of one of the ``trainers``, the functions holding the migrated steps)."""
    param_groups = m.Attribute(value=m.Name(optimizer), attr=m.Name("param_groups"))
    found: List[cst.BaseStatement] = []

    def touches(line: cst.SimpleStatementLine) -> bool:
        if m.findall(line, param_groups):
            return True
        for call in m.findall(line, m.Call()):
            assert isinstance(call, cst.Call)
            if m.matches(call.func, m.Attribute(value=m.Name(optimizer),
                                                attr=m.Name("add_param_group") | m.Name("load_state_dict")
                                                | m.Name("zero_grad"))):
                return True
            if m.matches(call.func, m.Attribute(value=m.Name(), attr=m.Name("step"))) and \
                    is_scheduler(call.func.value.value, line):  # type: ignore[attr-defined]
                return True
            if any(m.matches(arg.value, m.Name(optimizer)) for arg in call.args) and \
                    not (isinstance(call.func, cst.Name) and call.func.value in trainers):
                return True
        return False

    class Find(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if node in skipped or (node is not root and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))):
                return False
            if isinstance(node, cst.For) and m.findall(node.iter, param_groups):
                found.append(node)
                return False
            if isinstance(node, cst.SimpleStatementLine):
                if touches(node):
                    found.append(node)
                return False
            return True

    root.visit(Find())
    return found
