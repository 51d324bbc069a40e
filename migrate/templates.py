"""The statements and expressions the rules build from text, parsed once per text.

The rules write the code they add as text (``f"{model}.synchronize()\\n"``) and parse it with
``libcst.parse_statement`` / ``parse_expression``; the same texts recur within a file and
from file to file (``pass``, ``import roundpipe``, a step function's ``def``), and each parse
costs up to a millisecond. :func:`statement` parses a text the first time and hands out a
fresh copy of that tree on every call: a node must not stand at two places of one module
(the source order, the positions and the wrapping of long lines tell nodes apart by
identity). The copy makes new node objects with the same fields, without the validation and
the traversal of ``deep_clone`` (the tree was validated when parsed, and nodes are
immutable): about 0.4-0.6 of a parse of the same text. A text parsed only to be read is
handed out as the parsed tree itself (:func:`shared_expression`).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Dict, Tuple, TypeVar

import libcst as cst

__all__ = ["shared_expression", "statement"]

N = TypeVar("N", bound=cst.CSTNode)

#: Distinct texts kept parsed: the rules' templates are a few dozen per file; user code
#: copied through them (a moved statement's text) is not bounded, so the cache is.
_KEPT = 1024

#: Each node class's field names, in declaration order.
_FIELDS: Dict[type, Tuple[str, ...]] = {}


def statement(text: str) -> cst.BaseStatement:
    """What ``libcst.parse_statement(text)`` gives, as new nodes (raises its syntax error)."""
    return _fresh(_parsed_statement(text))


def shared_expression(text: str) -> cst.BaseExpression:
    """The tree ``libcst.parse_expression(text)`` gives, the same object for every call of
    the same text: to read, never to put into a module (raises its syntax error)."""
    return _parsed_expression(text)


@lru_cache(maxsize=_KEPT)
def _parsed_statement(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text)


@lru_cache(maxsize=_KEPT)
def _parsed_expression(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def _fresh(node: N) -> N:
    """A copy of the tree ``node`` made of new node objects (shared leaves that are not
    nodes: strings, sentinels)."""
    kind = type(node)
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(node))
    copy = object.__new__(kind)
    for name in names:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            value = _fresh(value)
        elif isinstance(value, (tuple, list)):
            value = type(value)(_fresh(item) if isinstance(item, cst.CSTNode) else item for item in value)
        object.__setattr__(copy, name, value)  # the nodes are frozen dataclasses
    return copy
