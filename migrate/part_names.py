"""Top-level names that two joined files bind each in its own way, kept apart while joined.

The project layer analyses a trainer and the files of its bases, or a loop and its step
helpers, as one module (:mod:`migrate.joined_classes`). Files of one program often bind
the same top-level name each for itself: a ``logger = logging.getLogger(__name__)``, a
``main()``, an ``args`` or a ``model`` of their own. Joined as they are, the later binding
would shadow the earlier one for the whole module, and the analysis would follow the wrong
object.

:func:`private_names` gives each such name, in each file that binds it, a spelling of its
own for the time the files are joined (``logger__rpm0``), on every use that the file's
scopes resolve to its top-level binding; :func:`restore` turns the spellings back in the
migrated text, diagnostics and report lines. Kept apart only when certain: the name is
bound in each of those files by a definition or an assignment (not an import line, which
:mod:`migrate.joined_classes` accepts only when identical), no other file imports it from
one of them, no file already spells it that way, and no ``global`` statement names it.
Anything else is a :class:`Clash` naming the file, the line and the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Set, Tuple, Union

import libcst as cst
from libcst.metadata import Assignment, MetadataWrapper, ScopeProvider

__all__ = ["Clash", "private_names", "renamed", "restore"]

#: A name as one part spells it while joined: ``{name}__rpm{part}``.
_PRIVATE = "{name}__rpm{part}"


@dataclass(frozen=True)
class Clash:
    """A top-level name two parts bind differently that cannot be kept apart."""

    path: str
    line: int
    name: str
    why: str

    def describe(self) -> str:
        return (
            f"{self.path}:{self.line} binds the top-level name `{self.name}` that another file binds too ({self.why})"
        )


def private_names(
    parts: Sequence[Tuple[str, str]],
    bound: Mapping[str, List[Tuple[int, str, int]]],
    joins: Set[Tuple[str, str]],
) -> Union[List[Dict[str, str]], Clash]:
    """Per part, ``{name: private spelling}`` for each name of ``bound`` (name -> (part,
    how it is bound: the import line or "", line)) that two parts bind differently; a
    :class:`Clash` for the first that cannot be kept apart. ``joins``: the (file, name)
    pairs of the imports that bind a name from another part."""
    renames: List[Dict[str, str]] = [{} for _ in parts]
    imported = {name for _, name in joins}
    for name, bindings in bound.items():
        owners = {part for part, _, _ in bindings}
        if len(owners) < 2 or _same_import(bindings):
            continue
        for part, how, line in bindings:
            path, source = parts[part]
            private = _PRIVATE.format(name=name, part=part)
            reason = ""
            if how:
                reason = "by an import line that differs from the other file's"
            elif name in imported:
                reason = "and another file imports it from a given file"
            elif re.search(rf"\bglobal\b[^\n]*\b{name}\b", source):
                reason = "named in a `global` statement"
            elif re.search(rf"\b{re.escape(private)}\b", source):
                reason = f"and the file already uses `{private}`"
            if reason:
                return Clash(path, line, name, reason)
            renames[part][name] = private
    return renames


def _same_import(bindings: List[Tuple[int, str, int]]) -> bool:
    """Every part binds the name by the very same import line."""
    return all(how and how == bindings[0][1] for _, how, _ in bindings)


def renamed(source: str, names: Mapping[str, str]) -> str:
    """``source`` with each top-level binding of a name of ``names``, and every use that
    resolves to it, spelled as ``names`` says."""
    if not names:
        return source
    wrapper = MetadataWrapper(cst.parse_module(source))
    scopes = wrapper.resolve(ScopeProvider)
    module_scope = scopes[wrapper.module]
    targets: Dict[cst.Name, str] = {}
    for name, private in names.items():
        for assignment in module_scope[name] if module_scope is not None else ():
            if not isinstance(assignment, Assignment):
                continue
            node = assignment.node
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                targets[node.name] = private
            elif isinstance(node, cst.Name):
                targets[node] = private
            for access in assignment.references:
                if isinstance(access.node, cst.Name):
                    targets[access.node] = private
    return wrapper.module.visit(_Renamer(targets)).code


class _Renamer(cst.CSTTransformer):
    def __init__(self, targets: Mapping[cst.Name, str]) -> None:
        self.targets = targets

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        private = self.targets.get(original_node)
        return updated_node.with_changes(value=private) if private is not None else updated_node


def restore(text: str, names: Mapping[str, str]) -> str:
    """``text`` with the private spellings of ``names`` turned back into the names."""
    for name, private in names.items():
        text = re.sub(rf"\b{re.escape(private)}\b", name, text)
    return text
