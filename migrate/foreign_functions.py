"""Functions of other given files that a file calls, parsed for the per-file analysis.

Real trainers keep their gradient helpers in a module of their own: DINO's
``utils.clip_gradients(student, clip)`` and ``utils.cancel_gradients_last_layer(...)``, a
project ``from utils import clip_grad_norm as clip``, ``from . import utils``. The project
layer (:mod:`migrate.project`) gives the engine, for each such call spelling of a file, the
called function with the metadata of its own file (:func:`foreign_functions`), so that
:mod:`migrate.gradient_helpers` judges it with the same checks as a function of the file
(its own calls are followed in its file). The helper's file itself is not rewritten: the
helper runs on what it is handed.

Only spellings bound by an import of the given file are listed: ``name`` for ``from m
import f as name``, ``alias.f`` for ``import m as alias`` / ``import m`` / ``from pkg
import m as alias``; :func:`imported_function` checks at the call that the spelling's first
name is that import's binding there (not a local or parameter of the same name).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Mapping, MutableMapping, Optional

import libcst as cst

from .names import ModuleFacts
from .syntax import dotted

if TYPE_CHECKING:
    from .project import ProjectFile

__all__ = ["ForeignFunction", "ForeignFunctions", "ast_dotted", "foreign_functions", "imported_function"]


@dataclass(frozen=True)
class ForeignFunction:
    """A top-level function ``function`` of the given file ``path``, whose metadata is ``facts``."""

    path: str
    facts: ModuleFacts
    function: cst.FunctionDef


#: call spelling in the calling file (``utils.clip_gradients``, ``clip``) -> the function
ForeignFunctions = Mapping[str, ForeignFunction]


def foreign_functions(
    files: Mapping[str, "ProjectFile"], path: str, parsed: MutableMapping[str, Optional[ModuleFacts]]
) -> Dict[str, ForeignFunction]:
    """The top-level functions of other given files that ``path`` calls through its imports,
    by call spelling. ``parsed`` keeps each file's metadata (None: it does not parse with
    libcst) across the files of one project."""
    tree = files[path].tree
    if tree is None:
        return {}
    called = {
        spelled
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for spelled in [ast_dotted(node.func)]
        if spelled
    }
    found: Dict[str, ForeignFunction] = {}
    for edge in files[path].imports:
        spelled = {bound: defined for bound, defined in edge.names}
        if edge.module_alias:
            spelled.update({f"{edge.module_alias}.{name}": name for name in _top_level_functions(files[edge.target])})
        wanted = {bound: defined for bound, defined in spelled.items() if bound in called}
        facts = _facts(files[edge.target], parsed) if wanted else None
        if facts is None:
            continue
        for bound, defined in wanted.items():
            function = _top_level_function(facts, defined)
            if function is not None:
                found[bound] = ForeignFunction(edge.target, facts, function)
    return found


def imported_function(facts: ModuleFacts, functions: ForeignFunctions, call: cst.Call) -> Optional[ForeignFunction]:
    """The function of another given file ``call`` runs (``functions`` by spelling), when
    the first name of its spelling is bound by an import where it is called; else None."""
    spelled = dotted(call.func)
    found = functions.get(spelled) if spelled is not None else None
    scope = facts.scope(call)
    if found is None or scope is None or spelled is None:
        return None
    root = spelled.split(".")[0]
    assignments = scope[root]
    imported = bool(assignments) and all(
        isinstance(getattr(a, "node", None), (cst.Import, cst.ImportFrom)) for a in assignments
    )
    return found if imported else None


def ast_dotted(node: ast.expr) -> Optional[str]:
    """``"f"`` for the name ``f``, ``"m.f"`` for ``m.f`` (of Python's ``ast``); None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _top_level_functions(project_file: "ProjectFile") -> List[str]:
    tree = project_file.tree
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] if tree is not None else []


def _facts(project_file: "ProjectFile", parsed: MutableMapping[str, Optional[ModuleFacts]]) -> Optional[ModuleFacts]:
    if project_file.path not in parsed:
        try:
            module = cst.parse_module(project_file.source)
        except cst.ParserSyntaxError:
            parsed[project_file.path] = None
        else:
            parsed[project_file.path] = ModuleFacts(cst.MetadataWrapper(module, unsafe_skip_copy=True))
    return parsed[project_file.path]


def _top_level_function(facts: ModuleFacts, name: str) -> Optional[cst.FunctionDef]:
    for statement in facts.module.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None
