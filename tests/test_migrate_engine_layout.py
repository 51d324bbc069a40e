"""The engine's own module facts agree with the libcst metadata they replace, node for node.

:mod:`migrate.source_layout` (positions and source order from one code generation),
:mod:`migrate.expression_contexts` (contexts worked out from the parents when asked) and
:func:`migrate.scopes.module_scopes` (``ScopeVisitor`` fed those contexts) stand in for
``PositionProvider``, ``ParentNodeProvider``, ``ExpressionContextProvider`` and
``ScopeProvider``; a libcst upgrade that changes any of them shows up here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Sequence

import libcst as cst
import pytest
from libcst.metadata import (
    ExpressionContextProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    Scope,
    ScopeProvider,
)

from migrate.expression_contexts import ExpressionContexts
from migrate.scopes import module_scopes
from migrate.source_layout import module_layout

#: Every construct that stores, loads or deletes a name, or holds a name it does not reach.
PROGRAM = """\
import a.b as c
from x import y as z
a, (b, *c) = d
[e, f.g] = h[i:j, k]
del l, m.n, o[p]
q += r
s: t = u
(v := w)
for x1, x2 in y1:
    pass
else:
    pass
[x3 for x4 in x5 if x6 for x7 in x8]
with open(f) as (g1, g2):
    pass
try:
    pass
except E as e1:
    pass
@dec(a1)
class C(B1, metaclass=M1):
    def m(self, x9: int = 1, *args, k10=2, **kw) -> R1:
        global gg
        lam = lambda p1, p2=q2: p1  # a comment
        f11(kw1=1)
        match cmd:
            case [aa, *bb] if cc:
                pass
            case P(x=xx) as yy:
                pass
def gen[T: bound1](x: T) -> T:
    return x
def hinted(x1: "typing.List[K1]") -> "R2":
    import os.path as op, json
    from .rel import thing
    nonlocal_like = [op.join(json) for _ in thing]
    return x1
a[lambda y3: y3] = 1
(a).b = 1
print(*stars, **dd)
"""

TEXTS = {
    "lf": PROGRAM,
    "crlf": PROGRAM.replace("\n", "\r\n"),
    "no final newline": "def f():\n\tif a:\n\t\treturn 1",
}


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_layout_gives_libcst_positions_parents_and_code(text: str) -> None:
    module = cst.parse_module(text)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    layout = module_layout(module)
    assert layout.code == module.code
    assert set(layout.order) == set(positions)
    assert {node: layout.positions[node] for node in positions} == dict(positions)
    assert {node: parent for node, (_, _, parent) in layout.order.items() if parent is not None} == dict(parents)
    for node, (start, end, _) in layout.order.items():  # a subtree's ranks hold its descendants
        assert end - start == 1 + sum(layout.order[child][1] - layout.order[child][0] for child in node.children)


def test_expression_contexts_are_libcsts() -> None:
    module = cst.parse_module(PROGRAM)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ExpressionContextProvider)
    contexts = ExpressionContexts(module_layout(module).order)
    nodes = list(module_layout(module).order)
    assert {node: contexts.get(node) for node in nodes} == {node: expected.get(node) for node in nodes}
    assert any(node not in contexts for node in nodes if isinstance(node, cst.Name))  # an attribute's name


#: The migrate fixtures and example scripts: the scopes must agree on each.
FIXTURES = sorted(
    [*Path(__file__).parent.glob("migrate_cases/*.py"), *(Path(__file__).parent.parent / "examples").glob("*.py")]
)


def _bindings(scopes: Mapping[cst.CSTNode, object], nodes: Sequence[cst.CSTNode]) -> Dict[object, object]:
    """Per node of ``nodes`` with a scope: what kind of scope of which node it is, under which
    one, and the qualified names of a name or attribute there; per scope: what it binds (name,
    node, the nodes reading it) and what it reads (node, referents)."""
    found: Dict[object, object] = {}
    for node in nodes:
        scope = scopes.get(node)
        if not isinstance(scope, Scope):
            continue
        where = (type(scope), getattr(scope, "node", None), getattr(scope.parent, "node", None))
        names = scope.get_qualified_names_for(node) if isinstance(node, (cst.Name, cst.Attribute)) else ()
        found[node] = (where, {(q.name, q.source) for q in names})
        if where not in found:
            bound = {
                (a.name, getattr(a, "node", None), frozenset(r.node for r in a.references)) for a in scope.assignments
            }
            read = {
                (access.node, frozenset(getattr(a, "node", None) for a in access.referents))
                for access in scope.accesses
            }
            found[where] = (bound, read)
    return found


def _scopes_agree(text: str) -> None:
    module = cst.parse_module(text)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    layout = module_layout(module)
    nodes = layout.nodes
    scopes = module_scopes(module, layout.order, nodes)
    # The nodes parsed from a string annotation are made afresh by each analysis: only the
    # module's own nodes can be compared.
    assert set(scopes) & set(nodes) == set(expected) & set(nodes)
    assert _bindings(scopes, nodes) == _bindings(expected, nodes)


def test_module_scopes_are_libcsts() -> None:
    _scopes_agree(PROGRAM)


@pytest.mark.parametrize("path", FIXTURES, ids=[path.name for path in FIXTURES])
def test_module_scopes_are_libcsts_on_the_fixtures(path: Path) -> None:
    _scopes_agree(path.read_text())
