"""A trainer class whose bases (mixins) are defined in other files of the project.

detectron2- and MMEngine-style trainers compose their iteration from mixins of another
module: ``class AMPTrainer(ForwardMixin, BackwardMixin, UpdateMixin)`` in ``main.py``, the
mixins in ``hooks.py``, each reaching the scaler, model and optimizer through ``self``.
Alone, neither file shows what ``self.grad_scaler`` holds (hooks.py) or what the bases do
with it (main.py), so each is refused on its own. The project layer (:func:`join_groups`)
finds such files from their imports: a file whose class derives from a class that the
``from m import C`` it makes binds from another given file ``m``. The files are analysed
as one module (:func:`migrate_joined`): the base files first, then the file of the
subclass, each part after a marker statement, so the engine follows the attributes through
every method of the family as it does within one file. The migrated module is cut at the
markers back into the files, each gets its own ``import roundpipe`` and microbatch constant
where it reads them, and the diagnostics and rewrites go back to the file and line they name.

The same join serves a loop handing the scaler to step helpers of other files
(:func:`call_groups`; ``backward_step(loss, scaler)`` and ``optimizer_step(optimizer,
scaler, model)`` of ``steps.py``, the scaler returned by ``amp_setup.setup_amp``): the engine
follows the scaler, model and optimizer through the functions of the joined module
(:mod:`migrate.split_functions`).

Joined only when it is certain that one module means the same as the files: a top-level
name bound in two of the files (other than by the very same import line, or the import of
a base from its file) is spelled apart in each while joined (:mod:`migrate.part_names`),
or the files are not joined (:func:`join_blocker` says which name blocks). A one-line
``from __future__`` import, which must open its module,
is a comment while the files are joined and comes back in its place.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m

from .diagnostics import Diagnostic, FileResult, Rewrite
from .engine import SCALER_USE, migrate_source
from .header import add_header
from .part_names import Clash, private_names, renamed, restore
from .prefilter import might_use_amp

if TYPE_CHECKING:
    from .project import ImportEdge, ProjectFile

__all__ = ["call_groups", "join_blocker", "join_groups", "migrate_joined", "shared_names"]

_MARKER = "__roundpipe_migrate_part__ = {index}  # joined part {index}\n"
_MARKER_LINE = re.compile(r"^__roundpipe_migrate_part__ = (\d+)  # joined part \d+\n", re.M)
_FUTURE = re.compile(r"^(from __future__ import [\w, ]+\n)", re.M)
_FUTURE_KEPT = "# roundpipe-migrate joined: "  # a __future__ import, kept as a comment
_PRIVATE_LEFT = re.compile(r"__rpm\d")
_CONSTANT = re.compile(r"^(\w+) = 1  # roundpipe-migrate: microbatches per batch", re.M)


def join_groups(files: Mapping[str, "ProjectFile"]) -> List[List[str]]:
    """Groups of given files to analyse as one module: for each file deriving from or
    building classes of other given files (a trainer and its mixins, a script and the
    trainer it hands a scaler), the files defining those classes first (in path order),
    that file last."""
    groups: List[List[str]] = []
    for path in sorted(files):
        tree = files[path].tree
        if tree is None:
            continue
        imported = _imported(files, path, _classes)
        bases = {
            imported[base.id]
            for node in tree.body
            if isinstance(node, ast.ClassDef)
            for base in node.bases
            if isinstance(base, ast.Name) and base.id in imported
        }
        built = _called_amp_files(files, tree, imported)  # trainer classes only: not datasets or models
        if bases | built:
            groups.append([*sorted(bases | built), path])
    return groups


def call_groups(files: Mapping[str, "ProjectFile"]) -> List[List[str]]:
    """Groups of given files to analyse as one module: for each file calling top-level
    functions of other given files that mention AMP (its step helpers), those files first
    (in path order), that file last. A group is left out when another given file imports
    one of its helper files: the helpers would be migrated for one caller only."""
    groups: List[List[str]] = []
    edges = _edges(files)
    for path in sorted(files):
        tree = files[path].tree
        if tree is None:
            continue
        helpers = _called_amp_files(files, tree, _imported(files, path, _functions))
        group = [*sorted(helpers), path]
        importers = {edge.importer for edge in edges if edge.target in helpers}
        if helpers and importers <= set(group):
            groups.append(group)
    return groups


def _imported(
    files: Mapping[str, "ProjectFile"], path: str, defined_in: Callable[[Optional[ast.Module]], Set[str]]
) -> Dict[str, str]:
    """Name -> the given file defining it, for each ``from m import name`` of ``path`` that
    binds, under its own name, a top-level definition ``defined_in`` lists."""
    return {
        bound: edge.target
        for edge in files[path].imports
        for bound, defined in edge.names
        if bound == defined and defined in defined_in(files[edge.target].tree)
    }


def _called_amp_files(files: Mapping[str, "ProjectFile"], tree: ast.Module, imported: Mapping[str, str]) -> Set[str]:
    """The files of ``imported`` names that ``tree`` calls by name and that mention AMP."""
    called = {
        imported[node.func.id]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported
    }
    return {target for target in called if _mentions_amp(files[target].source)}


def shared_names(files: Mapping[str, "ProjectFile"], group: Sequence[str]) -> Set[Tuple[str, str]]:
    """(file, name) for each ``from m import name`` of a file of ``group`` that binds a
    top-level definition of another file of the group under its own name."""
    found: Set[Tuple[str, str]] = set()
    for path in group:
        for edge in files[path].imports:
            if edge.target in group:
                defined = _defined(files[edge.target].tree)
                found |= {(path, bound) for bound, name in edge.names if bound == name and name in defined}
    return found


def migrate_joined(
    parts: Sequence[Tuple[str, str]], exact: bool, joins: Set[Tuple[str, str]]
) -> Optional[Dict[str, FileResult]]:
    """The results for ``parts`` ((path, source), bases first) analysed as one module;
    None when they cannot be joined soundly. ``joins``: the (file, name) pairs of the
    ``from m import Base`` lines that bind a base from its part."""
    names = _private_names(parts, joins)
    if isinstance(names, str):
        return None
    texts = [
        _MARKER.format(index=index)
        + _FUTURE.sub(_FUTURE_KEPT + r"\1", renamed(source, names[index]))
        + ("" if source.endswith("\n") else "\n")
        for index, (_, source) in enumerate(parts)
    ]
    offsets = []
    line = 1
    for text in texts:
        offsets.append(line)  # the marker's line
        line += text.count("\n")
    joined = migrate_source("".join(texts), "<joined>", exact=exact, force=True)
    results = {path: FileResult(path=path, original=source, migrated=source) for path, source in parts}
    for diagnostic in joined.diagnostics:
        path, local = _locate(parts, offsets, diagnostic.line)
        if path is None:
            return None  # a diagnostic about the joined module itself (RPM116, RPM190)
        message = restore(
            _local_lines(diagnostic.message, parts, offsets, path), names[[p for p, _ in parts].index(path)]
        )
        results[path].diagnostics.append(Diagnostic(path, local, diagnostic.col, diagnostic.code, message))
    if not joined.changed:
        return results
    migrated = _cut(joined.migrated, len(parts))
    if migrated is None:
        return None
    constant = _CONSTANT.search(joined.migrated)
    for (path, source), text, own in zip(parts, migrated, names):
        text = restore(text.replace(_FUTURE_KEPT, ""), own)
        if _PRIVATE_LEFT.search(text):
            return None  # a name the rules made from a private spelling
        if text == source:
            continue
        module = cst.parse_module(text)
        read = {name.value for name in m.findall(module, m.Name()) if isinstance(name, cst.Name)}
        with_header = add_header(module, constant.group(1) if constant else "", read).code
        try:
            compile(with_header, path, "exec")
        except SyntaxError:
            return None
        results[path].migrated = with_header
    for rewrite in joined.rewrites:
        path, local = _locate(parts, offsets, rewrite.line)
        if path is not None:
            own = names[[p for p, _ in parts].index(path)]
            description = _local_lines(rewrite.description, parts, offsets, path)
            results[path].rewrites.append(Rewrite(local, restore(description, own)))
    every = {private: name for own in names for name, private in own.items()}
    for path in results:
        results[path].wrapped_models = [every.get(model, model) for model in joined.wrapped_models]
        results[path].handed_classes = [every.get(name, name) for name in joined.handed_classes]
    return results


def _mentions_amp(source: str) -> bool:
    return might_use_amp(source) or SCALER_USE.search(source) is not None


def _classes(tree: Optional[ast.Module]) -> Set[str]:
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)} if tree is not None else set()


def _functions(tree: Optional[ast.Module]) -> Set[str]:
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {node.name for node in tree.body if isinstance(node, kinds)} if tree is not None else set()


def _edges(files: Mapping[str, "ProjectFile"]) -> List["ImportEdge"]:
    return [edge for project_file in files.values() for edge in project_file.imports]


def _defined(tree: Optional[ast.Module]) -> Set[str]:
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {node.name for node in tree.body if isinstance(node, kinds)} if tree is not None else set()


def _bindings(
    parts: Sequence[Tuple[str, str]], joins: Set[Tuple[str, str]]
) -> Optional[Dict[str, List[Tuple[int, str, int]]]]:
    """Name -> (part, how: the import line or "", line) for every top-level binding of the
    parts but the imports of a base from its part; None when a part has a ``__future__``
    import over several lines."""
    bound: Dict[str, List[Tuple[int, str, int]]] = {}
    for index, (path, source) in enumerate(parts):
        tree = ast.parse(source)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                if node.end_lineno != node.lineno or not _FUTURE.search(source):
                    return None
                continue
            for name, how in _top_level_names(node, source):
                if (path, name) not in joins:
                    bound.setdefault(name, []).append((index, how, node.lineno))
    return bound


def _private_names(parts: Sequence[Tuple[str, str]], joins: Set[Tuple[str, str]]) -> Union[List[Dict[str, str]], str]:
    """Per part, the private spellings of its top-level names that another part binds too
    (:mod:`migrate.part_names`); else why the parts cannot be joined."""
    bound = _bindings(parts, joins)
    if bound is None:
        return "a `from __future__` import over several lines"
    names = private_names(parts, bound, joins)
    return names.describe() if isinstance(names, Clash) else names


def join_blocker(parts: Sequence[Tuple[str, str]], joins: Set[Tuple[str, str]]) -> Optional[str]:
    """Why ``parts`` cannot be analysed as one module, else None."""
    names = _private_names(parts, joins)
    return names if isinstance(names, str) else None


def _top_level_names(node: ast.stmt, source: str) -> List[Tuple[str, str]]:
    """(name, the import line when an import binds it, else "") for what ``node`` binds in
    the module's namespace (in the bodies of ``if``/``try``/``with``/loops too)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        line = ast.get_source_segment(source, node) or ""
        return [((a.asname or a.name).split(".")[0], line) for a in node.names]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, "")]
    found: List[Tuple[str, str]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            found += _top_level_names(child, source)
        elif isinstance(child, ast.ExceptHandler):
            found += [(child.name, "")] if child.name else []
            found += [n for statement in child.body for n in _top_level_names(statement, source)]
        else:
            found += [(n.id, "") for n in ast.walk(child) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return found


def _locate(parts: Sequence[Tuple[str, str]], offsets: List[int], line: int) -> Tuple[Optional[str], int]:
    """The part and its own line for a line of the joined module (None: a marker or before)."""
    for index in reversed(range(len(parts))):
        if line > offsets[index]:
            return parts[index][0], line - offsets[index]
    return None, line


_LINES = re.compile(r"\b(lines? )(\d+(?:(?:, | and )\d+)*)")


def _local_lines(text: str, parts: Sequence[Tuple[str, str]], offsets: List[int], path: str) -> str:
    """``text`` (a message about the joined module) with each ``line N`` / ``lines N, M``
    it names given as the line of its own file: the bare number in ``path``, ``file:N`` in
    another part."""

    def local(number: re.Match) -> str:
        part, line = _locate(parts, offsets, int(number.group()))
        return str(line) if part in (path, None) else f"{part}:{line}"

    return _LINES.sub(lambda found: found.group(1) + re.sub(r"\d+", local, found.group(2)), text)


def _cut(migrated: str, count: int) -> Optional[List[str]]:
    """The migrated text of each part, from the markers (what precedes the first marker is
    the joined module's header, re-made for each part)."""
    found = list(_MARKER_LINE.finditer(migrated))
    if [int(m.group(1)) for m in found] != list(range(count)):
        return None
    ends = [m.start() for m in found[1:]] + [len(migrated)]
    return [migrated[m.end() : end] for m, end in zip(found, ends)]
