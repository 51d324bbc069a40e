"""Template statements are parsed once per text and handed out as new nodes every time."""

from __future__ import annotations

from typing import List

import libcst as cst
import pytest

from migrate import templates

TEXTS = [
    "model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn, return_outputs=True)[1]\n",
    "def _loss_fn(outputs, labels):\n    a, b = labels  # split\n    pass\n",
    "import roundpipe\n",
]


def _nodes(root: cst.CSTNode) -> List[cst.CSTNode]:
    found = [root]
    for child in root.children:
        found.extend(_nodes(child))
    return found


@pytest.mark.parametrize("text", TEXTS)
def test_statement_is_the_parse_made_of_new_nodes(text: str) -> None:
    first, second = templates.statement(text), templates.statement(text)
    parsed = cst.parse_statement(text)
    assert first.deep_equals(parsed) and second.deep_equals(parsed)
    assert cst.Module([first]).code == cst.Module([parsed]).code == text
    assert not {id(node) for node in _nodes(first)} & {id(node) for node in _nodes(second)}


def test_shared_expression_is_one_tree_and_syntax_errors_are_raised() -> None:
    assert templates.shared_expression('state["optim"]') is templates.shared_expression('state["optim"]')
    with pytest.raises(cst.ParserSyntaxError):
        templates.shared_expression("state[")
    with pytest.raises(cst.ParserSyntaxError):
        templates.statement("def f(:\n")
