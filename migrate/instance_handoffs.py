"""Reads of a trainer instance's attributes in the functions the instance is handed to.

A caller in another file that holds an instance (``tr = Trainer()``) and, after
``tr.train_step(x)``, runs ``log_state(tr)`` with ``def log_state(t):
print(t.opt.param_groups[0]["lr"])`` reads the optimizer through the instance as surely as
``tr.opt`` would: it races with the asynchronous step the same way. :func:`first_handed_read`
follows such a call one level deep: to a top-level function of the caller's file, a method
of one of its classes (``Logger().log(tr)``, ``self.log(tr)``: any method of that name), or a
function of another given file the caller imports (resolved by the caller's ``resolve``).
"""

from __future__ import annotations

import ast
from typing import Callable, Iterator, List, NamedTuple, Optional, Set, Tuple

__all__ = ["HandedRead", "first_handed_read"]

#: a called name (``f``, ``module.f``) -> (file, function) of another given file, or None
Resolver = Callable[[str], Optional[Tuple[str, ast.FunctionDef]]]


class HandedRead(NamedTuple):
    """``read`` (``t.opt``, in the file ``path``) reads what ``call`` (in the caller's file)
    hands it: the instance named ``instance`` there."""

    path: str
    read: ast.Attribute
    call: ast.Call
    instance: str


def first_handed_read(
    path: str, tree: ast.Module, instances: Set[str], attributes: Set[str], resolve: Resolver
) -> Optional[HandedRead]:
    """The first (by the caller's line) read of one of ``attributes`` on a parameter that a
    call in ``tree`` (the file ``path``) feeds one of the names in ``instances``, in the
    function it calls; None when there is none."""
    found: List[HandedRead] = []
    for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
        fed = [(place, a.id) for place, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id in instances]
        keywords = {
            k.arg: k.value.id
            for k in call.keywords
            if k.arg and isinstance(k.value, ast.Name) and k.value.id in instances
        }
        if not fed and not keywords:
            continue
        for where, function, skipped in _callees(path, tree, call, resolve):
            params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]][skipped:]
            given = {**{params[place]: name for place, name in fed if place < len(params)}, **keywords}
            read = next(_reads(function, set(given), attributes), None)
            if read is not None:
                assert isinstance(read.value, ast.Name)  # as _reads finds them
                found.append(HandedRead(where, read, call, given[read.value.id]))
    return min(found, key=lambda h: (h.call.lineno, h.call.col_offset), default=None)


def _callees(
    path: str, tree: ast.Module, call: ast.Call, resolve: Resolver
) -> Iterator[Tuple[str, ast.FunctionDef, int]]:
    """(file, function, leading parameters the call does not feed: ``self``) for each
    function ``call`` may run."""
    func = call.func
    if isinstance(func, ast.Name):
        local = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func.id]
        yield from ((path, function, 0) for function in local)
    if isinstance(func, ast.Attribute):
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for method in cls.body:
                if isinstance(method, ast.FunctionDef) and method.name == func.attr:
                    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in method.decorator_list)
                    yield path, method, 0 if static else 1
    other = resolve(ast.unparse(func))
    if other is not None:
        yield other[0], other[1], 0


def _reads(function: ast.FunctionDef, names: Set[str], attributes: Set[str]) -> Iterator[ast.Attribute]:
    """``name.attr`` reads in ``function`` (in source order) of an ``attr`` of ``attributes``
    on a name of ``names``."""
    reads = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute) and node.attr in attributes
        if isinstance(node.value, ast.Name) and node.value.id in names
    ]
    yield from sorted(reads, key=lambda node: (node.lineno, node.col_offset))
