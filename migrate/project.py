"""Migrate the given files as one program.

:func:`migrate_project` runs the per-file engine (:func:`~migrate.engine.migrate_source`)
on every file that may take part in mixed-precision training, then makes the outcome
consistent over the project:

* every file is checked with Python's own parser first (fast), so a file that does not
  parse is reported (RPM901) even when it holds no AMP marker;
* which given file imports which (``import a.b``, ``from .b import c``) is resolved from the
  paths; a file imported by an AMP file is analysed whatever its text;
* a wrapped model handed to a function of another given file is not followed across files:
  the file is left unchanged (RPM110) rather than half-migrated;
* a loss-scaler wrapper class defined in one given file and built or called in others (the
  shape of timm's ``NativeScaler``) is migrated with them: those files are migrated again
  with a :class:`~migrate.scaler_wrapper.WrapperContext` saying what the others do with it;
  a file calling a wrapper class that was not migrated is named (RPM111) unless it was
  already reported;
* if a file is refused, every file connected to it through imports among the files that
  take part is left unchanged too (RPM110, naming the blocking file and line), and a file
  that may use a scaler, importing or imported by a refused file, is named even where it
  was left unchanged for want of anything to do (:mod:`migrate.scaler_neighbours`).

It never imports torch.
"""

from __future__ import annotations

import ast
import posixpath
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import AbstractSet, Dict, FrozenSet, List, Mapping, Optional, Set, Tuple

from .amp_helper_class import amp_helper_roles
from .diagnostics import Diagnostic, FileResult
from .engine import migrate_source
from .foreign_functions import ast_dotted, foreign_functions
from .gradient_helpers import is_gradient_only, walks_gradients
from .instance_handoffs import HandedRead, first_handed_read
from .instance_state import step_state_attributes
from .joined_classes import call_groups, join_blocker, join_groups, migrate_joined, shared_names
from .names import ModuleFacts
from .optimizer_wrapper_class import is_optimizer_like
from .prefilter import calls_a_scaler, might_use_a_scaler
from .scaler_neighbours import name_silent_scaler_users
from .scaler_wrapper import LIBRARY_WRAPPERS, WrapperContext
from .state_helpers import StateHelper, find_state_helpers

__all__ = ["migrate_project", "project_view", "reconcile", "ProjectFile", "ImportEdge"]


@dataclass(frozen=True)
class ImportEdge:
    """``importer`` imports ``target`` (both given paths) at ``line``; ``names`` maps each
    name it binds from it to the name defined there (empty for ``import a.b``)."""

    importer: str
    target: str
    line: int
    names: Tuple[Tuple[str, str], ...]  # (bound here, defined there)
    module_alias: Optional[str]  # ``import a.b as m`` / ``from a import b``: the name bound to the module


@dataclass
class ProjectFile:
    """What the project view knows about one given file."""

    path: str
    source: str
    tree: Optional[ast.Module]
    imports: List[ImportEdge] = field(default_factory=list)

    @cached_property
    def state_helpers(self) -> Dict[str, StateHelper]:
        """The checkpoint helpers this file defines (:func:`find_state_helpers`), found once
        however many files import it."""
        return find_state_helpers(self.tree) if self.tree is not None else {}


def migrate_project(
    sources: Mapping[str, str], exact: bool = False, apex_target: str = "compat"
) -> Dict[str, FileResult]:
    """Migrate ``sources`` (path -> text) consistently; return one result per path.

    Paths are relative or absolute file paths using ``/``; modules are named from them
    (``pkg/train.py`` is ``pkg.train`` and also ``train``). A result never holds a change
    while a file it depends on, or that depends on it, was refused.
    """
    files = project_view(sources)
    amp = {path for path, f in files.items() if f.tree is not None and might_use_a_scaler(f.source)}
    imported_by_amp = {edge.target for path in amp for edge in files[path].imports}
    results: Dict[str, FileResult] = {}
    for path, project_file in files.items():
        if project_file.tree is None:
            results[path] = _syntax_error(project_file)
        else:
            results[path] = migrate_source(
                project_file.source,
                path,
                exact=exact,
                force=path in imported_by_amp and path not in amp,
                apex_target=apex_target,
            )
    reconcile(files, results, exact, apex_target)
    return results


def reconcile(
    files: Mapping[str, ProjectFile], results: Dict[str, FileResult], exact: bool = False, apex_target: str = "compat"
) -> None:
    """Apply the project rules to per-file ``results`` (keyed like ``files``), in place.

    The per-file results may come from anywhere (worker processes included). A file that
    calls checkpoint helpers of another given file, and every file taking part in a
    loss-scaler wrapper of the project, is migrated again knowing what the other files say
    (``exact`` and ``apex_target`` as for the first run); a file is migrated again for the helpers only when it
    calls one that has a state-only parameter (no other call gives them a use). Afterwards
    no result holds a change while a file of the same program is refused, a wrapped model
    handed to another file's function refuses its file (unless it is a training function
    given the wrapper, or a checkpoint helper given the wrapped module), and users of a
    project loss-scaler wrapper that was not migrated are named.
    """
    wrappers = _wrapper_classes(files)
    contexts = wrapper_contexts(files, wrappers)
    parsed: Dict[str, Optional[ModuleFacts]] = {}
    gradient_only: Dict[str, Set[str]] = {}
    for path in files:  # in place: the caller may hold the result objects
        result, helpers, context = results[path], _state_helpers_of(files, path), contexts.get(path)
        tree = files[path].tree
        taking_part = tree is not None and bool(result.changed or result.diagnostics)
        helped = taking_part and tree is not None and _calls_a_state_helper(tree, helpers)
        called = foreign_functions(files, path, parsed) if taking_part else {}
        foreign = {name: f for name, f in called.items() if walks_gradients(f.facts, f.function)}
        gradient_only[path] = {name for name, f in foreign.items() if is_gradient_only(f.facts, f.function)}
        if context is not None or helped or foreign:
            again = migrate_source(
                files[path].source,
                path,
                exact=exact,
                force=True,
                state_helpers=helpers,
                wrappers=context,
                apex_target=apex_target,
                foreign=foreign,
            )
            result.migrated, result.rewrites = again.migrated, again.rewrites
            result.diagnostics, result.wrapped_models = again.diagnostics, again.wrapped_models
            result.handed_classes = again.handed_classes
    joined = _migrate_joined_classes(files, results, exact, wrappers)
    _refuse_models_handed_across(files, results, contexts, joined, gradient_only)
    _refuse_instances_reached_across(files, results, exact, joined)
    _name_wrapper_users(files, results, wrappers, joined)
    _keep_components_consistent(files, results)
    name_silent_scaler_users(files, results)


def _migrate_joined_classes(
    files: Mapping[str, ProjectFile],
    results: Dict[str, FileResult],
    exact: bool,
    wrappers: Mapping[Tuple[str, str], int],
) -> Dict[str, FrozenSet[str]]:
    """A class deriving from classes of other given files (mixins), where some of those
    files could not migrate alone or a base scales a loss and calls backward: the files are
    analysed as one module (:mod:`migrate.joined_classes`) and take that outcome; a file
    taking part in two such groups keeps its own. A file calling step helpers of other files
    refused alone (:func:`~migrate.joined_classes.call_groups`) is joined with them the
    same way, and that outcome is taken only when nothing in it is refused and it changes
    something (a joined module showing no step says nothing about the files' own). Returns, for
    each file given a joined outcome, the files of its group."""
    taken: Dict[str, FrozenSet[str]] = {}
    helper_groups = [(group, True) for group in call_groups(files)]
    for group, of_helpers in [(group, False) for group in join_groups(files)] + helper_groups:
        blocked = any(not d.is_info for p in group for d in results[p].diagnostics)
        scaling_base = any(p in group[:-1] and name in _base_names(files[group[-1]]) for p, name in wrappers)
        handed = _handed_elsewhere(files, results, group)
        reached = not of_helpers and _reads_instances_of(files, results, group, exact)
        if set(taken) & set(group):
            _report_unjoined_builder(results, taken, group)
            continue
        if not (blocked or scaling_base or handed or reached):
            continue
        joined = migrate_joined([(p, files[p].source) for p in group], exact, shared_names(files, group))
        if of_helpers and (joined is None or any(not d.is_info for r in joined.values() for d in r.diagnostics)):
            if joined is not None:
                _report_joined_blockers(files, results, group, joined)
            continue  # step helpers joined with their caller: taken only when the whole step migrates
        if of_helpers and joined is not None and not any(r.changed for r in joined.values()):
            continue  # the joined module shows no step (a wrapper class of another file): each keeps its own
        if joined is None:
            blocker = join_blocker([(p, files[p].source) for p in group], shared_names(files, group))
            for path, name in handed:  # its constructions there are not followed: unchanged
                _refuse(
                    results[path],
                    1,
                    f"{name}() is built in {group[-1]}, which cannot be analysed with this file "
                    f"({blocker or 'the joined analysis failed'}), so what it hands the class "
                    "is not followed; file left unchanged",
                )
            continue
        taken.update({path: frozenset(group) for path in group})
        for path, outcome in joined.items():  # in place: the caller may hold the result objects
            result = results[path]
            result.migrated, result.rewrites = outcome.migrated, outcome.rewrites
            result.diagnostics, result.wrapped_models = outcome.diagnostics, outcome.wrapped_models
            result.handed_classes = outcome.handed_classes
        # joined for its reads only (its classes migrate alone): a refusal leaves the whole group unchanged
        _name_silent_members(files, results, group, revert_changed=not (blocked or scaling_base or handed))
    return taken


def _name_silent_members(
    files: Mapping[str, ProjectFile], results: Dict[str, FileResult], group: List[str], revert_changed: bool
) -> None:
    """A joined group refused at a statement of one file (main.py reading the trainer's
    scaler from outside): every other file of the group that uses a scaler and is left
    unchanged without a word of its own is named (RPM110), pointing at that refusal; with
    ``revert_changed`` (the group was joined for its reads only, so its classes migrated
    alone) a file the analysis changed is put back and named too."""
    blockers = [(p, d) for p in group for d in results[p].diagnostics if not d.is_info]
    if not blockers:
        return
    blocker_path, blocker = blockers[0]
    for path in group:
        result = results[path]
        if any(not d.is_info for d in result.diagnostics):
            continue
        if result.changed and not revert_changed:
            continue
        if not result.changed and not might_use_a_scaler(files[path].source):
            continue
        line = min((e.line for e in files[path].imports if e.target in group), default=1)
        _refuse(
            result,
            line,
            f"left unchanged because {blocker_path}:{blocker.line} ({blocker.code}) is not migrated and "
            "this file is analysed with it as one module",
        )


def _report_unjoined_builder(
    results: Dict[str, FileResult], taken: Mapping[str, FrozenSet[str]], group: List[str]
) -> None:
    """``group`` (its last file builds or derives from classes of the others) overlaps a
    group already analysed as one module: a file is analysed in one group only. Where that
    analysis refused an overlapping file, the refusal did not see ``group``'s last file (it
    may say the class is built nowhere), so that file's refusal is completed with the real
    reason (RPM110)."""
    builder = group[-1]
    for path in group[:-1]:
        first = taken.get(path)
        if first is None or builder in first or not any(not d.is_info for d in results[path].diagnostics):
            continue
        others = ", ".join(p for p in sorted(first) if p != path)
        results[path].diagnostics.append(
            Diagnostic(
                path,
                1,
                1,
                "RPM110",
                f"analysed as one module with {others} only (a file is analysed in one such group): "
                f"what {builder} builds from it or hands it is not followed; left unchanged",
            )
        )


def _report_joined_blockers(
    files: Mapping[str, ProjectFile], results: Dict[str, FileResult], group: List[str], joined: Mapping[str, FileResult]
) -> None:
    """Step helpers and their caller, each refused alone only for not seeing the other
    (``GradScaler passed to a function defined elsewhere``), and refused together too: the
    joined analysis names the real blocker, so it replaces their own diagnostics (a file it
    reports nothing for is left unchanged because of it, RPM110 at its import of the group). Nothing when a
    file of the group changed alone."""
    if any(results[path].changed for path in group):
        return
    blocker_path, blocker = next((p, d) for p in group for d in joined[p].diagnostics if not d.is_info)
    for path in group:
        own = [d for d in joined[path].diagnostics if not d.is_info]
        results[path].diagnostics = own or [
            Diagnostic(
                path,
                min((e.line for e in files[path].imports if e.target in group), default=1),
                1,
                "RPM110",
                f"left unchanged because {blocker_path}:{blocker.line} ({blocker.code}) is not migrated and "
                "this file takes part in the same training step",
            )
        ]


def _handed_elsewhere(
    files: Mapping[str, ProjectFile], results: Mapping[str, FileResult], group: List[str]
) -> List[Tuple[str, str]]:
    """(file, class) for each class of a changed file of ``group`` whose migration follows
    what its constructions in that file hand it (``FileResult.handed_classes``) and that the
    group's last file builds too."""
    builder = files[group[-1]].tree
    calls = ast.walk(builder) if builder is not None else ()
    built = {n.func.id for n in calls if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    found = []
    for path in group[:-1]:
        names = set(results[path].handed_classes) & built
        found += [(path, name) for name in sorted(names)] if results[path].changed else []
    return found


def _base_names(project_file: ProjectFile) -> Set[str]:
    """The plain names the file's top-level classes derive from."""
    tree = project_file.tree
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)] if tree is not None else []
    return {base.id for c in classes for base in c.bases if isinstance(base, ast.Name)}


# ---------------------------------------------------------------- parsing and imports
def project_view(sources: Mapping[str, str]) -> Dict[str, ProjectFile]:
    """Every given file parsed with Python's parser (``tree`` None: it does not parse),
    with the imports of other given files it makes."""
    files = {path: _parse(path, text) for path, text in sources.items()}
    resolver = _Resolver(list(files))
    for project_file in files.values():
        if project_file.tree is not None:
            project_file.imports = resolver.edges(project_file)
    return files


def _parse(path: str, source: str) -> ProjectFile:
    try:
        tree: Optional[ast.Module] = ast.parse(source, filename=path)
    except (SyntaxError, ValueError):
        tree = None
    return ProjectFile(path, source, tree)


def _syntax_error(project_file: ProjectFile) -> FileResult:
    result = FileResult(path=project_file.path, original=project_file.source, migrated=project_file.source)
    try:
        ast.parse(project_file.source, filename=project_file.path)
    except SyntaxError as err:
        result.diagnostics.append(
            Diagnostic(
                project_file.path,
                err.lineno or 1,
                (err.offset or 0) or 1,
                "RPM901",
                f"syntax error, file skipped: {err.msg}",
            )
        )
    except ValueError as err:  # e.g. a NUL byte
        result.diagnostics.append(Diagnostic(project_file.path, 1, 1, "RPM901", f"syntax error, file skipped: {err}"))
    return result


class _Resolver:
    """Maps dotted module names to the given paths that can be that module."""

    def __init__(self, paths: List[str]) -> None:
        self._by_name: Dict[str, List[str]] = {}
        for path in paths:
            for name in _module_names(path):
                self._by_name.setdefault(name, []).append(path)

    def find(self, dotted: str) -> Optional[str]:
        found = self._by_name.get(dotted, [])
        return found[0] if len(found) == 1 else None  # ambiguous names are not guessed

    def edges(self, project_file: ProjectFile) -> List[ImportEdge]:
        assert project_file.tree is not None
        edges: List[ImportEdge] = []
        for node in ast.walk(project_file.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self.find(alias.name)
                    if target is not None and target != project_file.path:
                        bound = alias.asname or (alias.name if "." not in alias.name else None)
                        edges.append(ImportEdge(project_file.path, target, node.lineno, (), bound))
            elif isinstance(node, ast.ImportFrom):
                base = self._base(project_file.path, node)
                if base is None:
                    continue
                module = self.find(base) if base else None
                names = tuple(
                    (a.asname or a.name, a.name) for a in node.names if self.find(_join(base, a.name)) is None
                )
                if module is not None and module != project_file.path and names:
                    edges.append(ImportEdge(project_file.path, module, node.lineno, names, None))
                for alias in node.names:  # from pkg import submodule
                    sub = self.find(_join(base, alias.name))
                    if sub is not None and sub != project_file.path:
                        edges.append(ImportEdge(project_file.path, sub, node.lineno, (), alias.asname or alias.name))
        return edges

    @staticmethod
    def _base(path: str, node: ast.ImportFrom) -> Optional[str]:
        """The absolute dotted name a ``from ... import`` reads from ('' for the folder)."""
        if not node.level:
            return node.module or ""
        folder = posixpath.dirname(path).split("/") if posixpath.dirname(path) else []
        if node.level - 1 > len(folder):
            return None
        parts = folder[: len(folder) - (node.level - 1)] if node.level > 1 else folder
        return ".".join([p for p in parts if p] + ([node.module] if node.module else []))


def _join(base: str, name: str) -> str:
    return f"{base}.{name}" if base else name


def _module_names(path: str) -> List[str]:
    """``a/b/c.py`` -> ``a.b.c``, ``b.c``, ``c``; ``a/b/__init__.py`` -> ``a.b``, ``b``."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or not parts[-1].endswith(".py"):
        return []
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return [".".join(parts[i:]) for i in range(len(parts)) if parts[i:]]


# ---------------------------------------------------------------- project-level checks
def _refuse(result: FileResult, line: int, message: str) -> None:
    """Leave ``result``'s file unchanged, saying why."""
    result.migrated = result.original
    result.rewrites = []
    result.wrapped_models = []
    result.handed_classes = []
    result.diagnostics.append(Diagnostic(result.path, line, 1, "RPM110", message))


def _imported_functions(project_file: ProjectFile) -> Dict[str, Tuple[str, int]]:
    """Name (or ``module.name``) under which this file calls a function of another given
    file -> (that file, import line)."""
    found: Dict[str, Tuple[str, int]] = {}
    for edge in project_file.imports:
        for bound, _ in edge.names:
            found[bound] = (edge.target, edge.line)
        if edge.module_alias:
            found[edge.module_alias + "."] = (edge.target, edge.line)
    return found


def _callee(node: ast.Call, imported: Dict[str, Tuple[str, int]]) -> Optional[Tuple[str, str, int]]:
    func = node.func
    if isinstance(func, ast.Name) and func.id in imported:
        return (func.id, *imported[func.id])
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id + "." in imported:
        return (f"{func.value.id}.{func.attr}", *imported[func.value.id + "."])
    return None


def _state_helpers_of(files: Mapping[str, ProjectFile], path: str) -> Dict[str, StateHelper]:
    """The checkpoint helpers of other given files that ``path`` imports, under the names
    its call sites use (``save_checkpoint``, ``ckpt.save_checkpoint``)."""
    found: Dict[str, StateHelper] = {}
    for edge in files[path].imports:
        defined = files[edge.target].state_helpers
        for bound, name in edge.names:
            if name in defined:
                found[bound] = defined[name]
        if edge.module_alias:
            found.update({f"{edge.module_alias}.{name}": helper for name, helper in defined.items()})
    return found


def _calls_a_state_helper(tree: ast.Module, helpers: Mapping[str, StateHelper]) -> bool:
    """``tree`` may call one of ``helpers`` that has a state-only parameter: a call whose
    function reads ``name`` or ``module.name`` as the helper's key (the engine compares its
    code, so a call it matches is found here too)."""
    keys = {name for name, helper in helpers.items() if helper.state_only}
    return bool(keys) and any(isinstance(node, ast.Call) and ast_dotted(node.func) in keys for node in ast.walk(tree))


def _refuse_models_handed_across(
    files: Mapping[str, ProjectFile],
    results: Dict[str, FileResult],
    contexts: Mapping[str, WrapperContext],
    joined: Mapping[str, AbstractSet[str]] = MappingProxyType({}),
    gradient_only: Mapping[str, AbstractSet[str]] = MappingProxyType({}),
) -> None:
    """A wrapped model passed to a function of another given file: what that function does
    with it (checkpoint keys, evaluation, another trainer) is not followed across files,
    except for the wrapper shape (:func:`_handed_to_wrapper_user`) and gradient helpers
    (``gradient_only``: their call spellings per file) called before the step or in it.
    The migrated text is what is checked: where the engine hands such a function the wrapped module instead
    (``model.model``: a checkpoint helper, an optimizer helper), nothing is handed across;
    the refusal names the call's line in the original."""
    for path, result in results.items():
        if not result.changed or not result.wrapped_models or files[path].tree is None:
            continue
        imported = _imported_functions(files[path])
        wrapped = set(result.wrapped_models)
        wrapped |= {name.partition(".")[0] for name in result.wrapped_models if "." in name}  # `self` of `self.model`
        migrated = ast.parse(result.migrated)
        before_step = _calls_before_a_step(migrated, wrapped) if gradient_only.get(path) else set()
        for node in ast.walk(migrated):
            callee = _callee(node, imported) if isinstance(node, ast.Call) else None
            passed = _names_passed(node, wrapped) if callee is not None else []
            if callee is not None and callee[1] in joined.get(path, ()):
                continue  # analysed with this file as one module (migrate.joined_classes)
            if callee is not None and callee[0] in gradient_only.get(path, ()) and node in before_step:
                continue  # a gradient helper of that file, before or in the step (migrate.gradient_helpers)
            if callee is not None and passed and callee[0] in contexts.get(path, WrapperContext()).classes:
                continue  # `Wrapper(model=model)`: the migrated wrapper is given the model it steps
            if (
                callee is not None
                and isinstance(node, ast.Call)  # it is when callee is not None
                and passed
                and (path in contexts or callee[1] in contexts)
                and _handed_to_wrapper_user(files, results, contexts, path, node, callee)
            ):
                continue
            if callee is not None and passed:
                name, target, _ = callee
                _refuse(
                    result,
                    _original_line(files[path], name, passed[0]),
                    f"the model {passed[0]!r} would be wrapped with RoundPipe, "
                    f"but it is passed to {name}() of {target}, which the migration does not "
                    "follow across files (checkpoint keys, evaluation, other trainers); "
                    "file left unchanged",
                )
                break


def _calls_before_a_step(tree: ast.Module, wrapped: Set[str]) -> Set[ast.AST]:
    """The calls of the migrated ``tree`` that run before a ``model.step(...)`` of a wrapped
    model in their function (a later statement of their block or of a block around them),
    or inside the step function under ``with roundpipe.OptimizerCtx():``: where a gradient
    helper may be handed the model."""
    found: Set[ast.AST] = set()

    def visit(statements: List[ast.stmt], step_follows: bool) -> None:
        for index, statement in enumerate(statements):
            follows = step_follows or any(_steps_a_model(s, wrapped) for s in statements[index + 1 :])
            if follows or _in_optimizer_context(statement):
                found.update(n for n in _own_nodes(statement) if isinstance(n, ast.Call))
                continue
            for child in _child_blocks(statement):
                visit(child, False)

    visit(tree.body, False)
    return found


def _child_blocks(statement: ast.stmt) -> List[List[ast.stmt]]:
    blocks = [getattr(statement, name, None) for name in ("body", "orelse", "finalbody")]
    blocks += [h.body for h in getattr(statement, "handlers", ())]
    return [b for b in blocks if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]


def _own_nodes(statement: ast.stmt) -> List[ast.AST]:
    """The nodes of ``statement`` (the body of the function it defines included), not entering the
    functions, lambdas and classes defined inside it."""
    found: List[ast.AST] = []
    pending: List[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                pending.append(child)
    return found


def _steps_a_model(statement: ast.stmt, wrapped: Set[str]) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "step"
        and ast_dotted(n.func.value) in wrapped
        for n in _own_nodes(statement)
    )


def _in_optimizer_context(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.With) and any(
        isinstance(i.context_expr, ast.Call) and ast_dotted(i.context_expr.func) == "roundpipe.OptimizerCtx"
        for i in statement.items
    )


def _names_passed(node: ast.AST, names: Set[str]) -> List[str]:
    """The ``names`` (plain or dotted, ``self.model``) a call passes as arguments."""
    assert isinstance(node, ast.Call)
    passed = [a for a in [*node.args, *(k.value for k in node.keywords)] if isinstance(a, (ast.Name, ast.Attribute))]
    return [ast.unparse(a) for a in passed if ast.unparse(a) in names]


def _original_line(project_file: ProjectFile, callee: str, model: str) -> int:
    """The line of the original's first call of ``callee`` passing ``model`` (else 1)."""
    assert project_file.tree is not None
    imported = _imported_functions(project_file)
    lines = [
        node.lineno
        for node in ast.walk(project_file.tree)
        if isinstance(node, ast.Call)
        and (_callee(node, imported) or ("",))[0] == callee
        and model in _names_passed(node, {model})
    ]
    return min(lines, default=1)


def _refuse_instances_reached_across(
    files: Mapping[str, ProjectFile],
    results: Dict[str, FileResult],
    exact: bool = False,
    joined: Mapping[str, FrozenSet[str]] = MappingProxyType({}),
) -> None:
    """A model wrapped in an attribute of a class (``self.model``) and read through an
    instance of that class in another given file (``trainer = Trainer(); trainer.model.eval()``
    in main.py): that use is not migrated with it, so the class's file is refused. Without
    ``exact`` the same holds for the optimizer and what is built from it or the model
    (``trainer.sched.step()`` after ``trainer.train_step(...)`` would race with the
    asynchronous step: :mod:`migrate.instance_state`). A file analysed with the class's
    file as one module (``joined``: its group) had its own reads migrated there; only the
    functions it hands an instance to are looked into."""
    for path, result in results.items():
        held = _held_attributes(files[path], result, exact)
        if not held:
            continue
        models = {name.partition(".")[2] for name in result.wrapped_models if "." in name}
        for other, project_file in files.items():
            direct = other not in joined.get(path, frozenset())
            uses = [_instance_attribute_use(files, project_file, path, {name}, held[name], direct) for name in held]
            use = min((u for u in uses if u is not None), key=lambda u: u[1].lineno, default=None)
            if use is not None:
                class_name, node, handed = use
                what = (
                    f"the model in `.{node.attr}` of {class_name} instances would be wrapped with RoundPipe"
                    if node.attr in models
                    else f"`.{node.attr}` of {class_name} instances holds state that the asynchronous step of "
                    "its RoundPipe model updates (it would race with that step)"
                )
                tree = files[path].tree
                assert tree is not None  # nothing is held in a file that does not parse
                line = next(n.lineno for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
                _refuse(
                    result,
                    line,
                    f"{what}, but {_read_place(other, node, handed)}, which the migration does not follow across "
                    "files; file left unchanged",
                )
                break
            if not direct and other != path:
                _refuse_instance_models_handed_out(files, results[other], path, set(held), models, joined[path])


def _refuse_instance_models_handed_out(
    files: Mapping[str, ProjectFile],
    result: FileResult,
    path: str,
    classes: Set[str],
    models: Set[str],
    group: AbstractSet[str],
) -> None:
    """The file of ``result``, analysed with ``path`` as one module (``group``), hands the
    wrapped model of an instance of one of ``classes`` (``trainer.model``, ``models`` naming
    the attributes) to a function of a given file outside the group
    (``evaluate(trainer.model, x)`` of utils.py): refused as a plain model handed across
    files is (:func:`_refuse_models_handed_across`). The migrated text is checked, so a
    call the analysis gave the wrapped module instead (``trainer.model.model``) is not."""
    project_file = files[result.path]
    instances = _instances_built(project_file, path, classes)
    handed = {f"{instance}.{attribute}" for instance in instances for attribute in models}
    if not handed:
        return
    imported = _imported_functions(project_file)
    found: List[Tuple[int, str, str, str]] = []  # (original line, model, callee, its file)
    for node in ast.walk(ast.parse(result.migrated)):
        callee = _callee(node, imported) if isinstance(node, ast.Call) else None
        passed = _names_passed(node, handed) if callee is not None and callee[1] not in group else []
        if callee is not None and passed:
            found.append((_original_line(project_file, callee[0], passed[0]), passed[0], callee[0], callee[1]))
    if found:
        line, model, name, target = min(found)
        _refuse(
            result,
            line,
            f"the model {model!r} would be wrapped with RoundPipe, but it is passed to {name}() of {target}, "
            "which the migration does not follow across files (checkpoint keys, evaluation, other trainers); "
            "file left unchanged",
        )


def _held_attributes(project_file: ProjectFile, result: FileResult, exact: bool) -> Dict[str, Set[str]]:
    """For each top-level class of a changed file holding a wrapped model in an attribute,
    the attributes whose reads through an instance elsewhere race with its step or see the
    wrap (:func:`_refuse_instances_reached_across`); empty for any other file."""
    tree = project_file.tree
    models = {name.partition(".")[2] for name in result.wrapped_models if "." in name}
    if not result.changed or not models or tree is None:
        return {}
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    return {cls.name: models if exact else step_state_attributes(cls, models) for cls in classes}


def _reads_instances_of(
    files: Mapping[str, ProjectFile], results: Mapping[str, FileResult], group: List[str], exact: bool
) -> bool:
    """The last file of ``group`` reads, through an instance it builds, what a class of a
    changed file of the group holds for its step (``trainer.optimizer.param_groups``): the
    files are analysed as one module, so those reads are migrated with the class."""
    for path in group[:-1]:
        held = _held_attributes(files[path], results[path], exact)
        reader = files[group[-1]]
        uses = [_instance_attribute_use(files, reader, path, {name}, held[name]) for name in held]
        if any(use is not None and use[2] is None for use in uses):  # read there, not in a function handed it
            return True
    return False


def _instance_attribute_use(
    files: Mapping[str, ProjectFile],
    project_file: ProjectFile,
    path: str,
    classes: Set[str],
    attributes: Set[str],
    direct: bool = True,
) -> Optional[Tuple[str, ast.Attribute, Optional[HandedRead]]]:
    """(class, ``x.attr``, None) for the first read (by line) of one of ``attributes`` on a
    name that ``project_file`` binds to an instance of a class of ``classes`` imported from
    ``path`` (only where ``direct``); else (class, ``t.attr``, where) for one in a function
    such a name is handed to (:mod:`migrate.instance_handoffs`)."""
    if project_file.tree is None:
        return None
    instances = _instances_built(project_file, path, classes)
    if not instances:  # the file does not build instances of the classes: none to read
        return None
    reads = [
        node
        for node in ast.walk(project_file.tree)
        if isinstance(node, ast.Attribute) and node.attr in attributes and isinstance(node.value, ast.Name)
        if node.value.id in instances
    ]
    first = min(reads, key=lambda node: (node.lineno, node.col_offset), default=None)
    if first is not None and direct:
        return instances[ast.unparse(first.value)], first, None
    imported = {here: (edge.target, there) for edge, here, there in _imported_names(files, project_file)}

    def resolve(called: str) -> Optional[Tuple[str, ast.FunctionDef]]:
        target, name = imported.get(called, ("", ""))
        function = _function_named(files[target], name) if target else None
        return None if function is None else (target, function)

    handed = first_handed_read(project_file.path, project_file.tree, set(instances), attributes, resolve)
    if handed is None:
        return None
    return instances[handed.instance], handed.read, handed


def _instances_built(project_file: ProjectFile, path: str, classes: Set[str]) -> Dict[str, str]:
    """The names ``project_file`` assigns a construction of one of ``classes`` imported from
    ``path`` (``trainer = Trainer()``, ``trainer = trainers.Trainer()``) -> that class."""
    bound: Dict[str, str] = {}  # name under which the file calls the class -> the class
    for edge in project_file.imports:
        if edge.target == path:
            bound.update({here: there for here, there in edge.names if there in classes})
            if edge.module_alias:
                bound.update({f"{edge.module_alias}.{c}": c for c in classes})
    instances: Dict[str, str] = {}
    if project_file.tree is None or not bound:
        return instances
    for node in ast.walk(project_file.tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            built = bound.get(ast.unparse(node.value.func))
            instances.update({t.id: built for t in node.targets if built and isinstance(t, ast.Name)})
    return instances


def _read_place(path: str, read: ast.Attribute, handed: Optional[HandedRead]) -> str:
    """Where ``read`` reads an instance's attribute, ``path`` holding the instance."""
    if handed is None:
        return f"{path}:{read.lineno} reads it (`{ast.unparse(read)}`) through an instance"
    return (
        f"{handed.path}:{read.lineno} reads it (`{ast.unparse(read)}`) through the instance that "
        f"{path}:{handed.call.lineno} hands to `{ast.unparse(handed.call.func)}(...)`"
    )


def _handed_to_wrapper_user(
    files: Mapping[str, ProjectFile],
    results: Dict[str, FileResult],
    contexts: Mapping[str, WrapperContext],
    path: str,
    call: ast.Call,
    callee: Tuple[str, str, int],
) -> bool:
    """Every wrapped model ``call`` passes goes to a checkpoint helper's state-only parameter
    (:mod:`migrate.state_helpers`) or to a parameter of a training function that the
    callee's file, migrated with the wrapper, treats as a RoundPipe model."""
    name, target, _ = callee
    wrapped = set(results[path].wrapped_models)
    helper = _state_helpers_of(files, path).get(name)
    saved = helper.state_only if helper is not None else frozenset()
    function = _function_named(files[target], _defined_name(files[path], name, target))
    params = [a.arg for a in function.args.args] if function is not None else []
    trainer = function is not None and any(
        f == function.name for f, _ in contexts.get(target, WrapperContext()).instance_params
    )
    for position, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id in wrapped:
            param = params[position] if position < len(params) else None
            if param not in saved and not (trainer and param in results[target].wrapped_models):
                return False
    for keyword in call.keywords:
        if isinstance(keyword.value, ast.Name) and keyword.value.id in wrapped:
            if keyword.arg not in saved and not (trainer and keyword.arg in results[target].wrapped_models):
                return False
    return True


def _wrapper_classes(files: Mapping[str, ProjectFile]) -> Dict[Tuple[str, str], int]:
    """(file, class name) -> line for classes that scale a loss and call backward (a
    loss-scaler wrapper such as timm's ``NativeScaler``)."""
    found: Dict[Tuple[str, str], int] = {}
    for path, project_file in files.items():
        if (
            project_file.tree is None
            or not calls_a_scaler(project_file.source)
            and "GradScaler" not in project_file.source
        ):
            continue
        for node in ast.walk(project_file.tree):
            if isinstance(node, ast.ClassDef):
                text = ast.get_source_segment(project_file.source, node) or ""
                if ("GradScaler" in text or ".scale(" in text) and ".backward(" in text and "roundpipe." not in text:
                    found[(path, node.name)] = node.lineno
    return found


def wrapper_contexts(
    files: Mapping[str, ProjectFile], found: Optional[Mapping[Tuple[str, str], int]] = None
) -> Dict[str, WrapperContext]:
    """For each file taking part in a loss-scaler wrapper class of another given file (one
    with ``__call__``: :mod:`migrate.scaler_wrapper`), what the other files say: the names
    it imports the class under, whether another file builds a class it defines, which of
    its functions' parameters another file feeds an instance; also for files building timm's
    wrapper (:data:`~migrate.scaler_wrapper.LIBRARY_WRAPPERS`) and handing it on.
    ``found``: :func:`_wrapper_classes` of ``files``, when already known."""
    wrappers = {
        key
        for key in (_wrapper_classes(files) if found is None else found)
        if any(isinstance(n, ast.FunctionDef) and n.name == "__call__" for n in _class(files[key[0]], key[1]).body)
        or is_optimizer_like(_class(files[key[0]], key[1]))
    } | set(_amp_helpers(files))
    libraries = {path: _library_wrapper_names(f) for path, f in files.items() if "NativeScaler" in f.source}
    if not wrappers and not any(libraries.values()):
        return {}
    classes: Dict[str, Set[str]] = {}
    built: Dict[str, Set[str]] = {}
    instance_params: Dict[str, Set[Tuple[str, str]]] = {}
    optimizer_like: Dict[str, Set[str]] = {}
    optimizer_params: Dict[str, Set[Tuple[str, str]]] = {}
    helper_roles: Dict[str, Set[Tuple[str, str, str]]] = {}
    helper_params: Dict[str, Set[Tuple[str, str, str, str]]] = {}
    for path, project_file in files.items():
        if project_file.tree is None:
            continue
        bound = {b: (e.target, d) for e, b, d in _imported_names(files, project_file) if (e.target, d) in wrappers}
        library = libraries.get(path, set())
        if not bound and not library:
            continue
        if bound:
            classes[path] = set(bound)
            optimizer_like[path] = {b for b, (t, d) in bound.items() if is_optimizer_like(_class(files[t], d))}
            helper_roles[path] = {
                (b, method, role)
                for b, (t, d) in bound.items()
                for method, role in (amp_helper_roles(_class(files[t], d)) or {}).items()
            }
        built_from = _instances(project_file.tree, set(bound) | library)
        instances = set(built_from)
        optimizer_instances = {n for n, c in built_from.items() if c in optimizer_like.get(path, ())}
        for name in set(built_from.values()) & set(bound):
            target, defined = bound[name]
            built.setdefault(target, set()).add(defined)
        helper_instances = {n: _roles_of(helper_roles, path, c) for n, c in built_from.items()}
        for edge, name, defined in _imported_names(files, project_file):
            function = _function_named(files[edge.target], defined)
            if function is None:
                continue
            params = [a.arg for a in function.args.args]
            for call in _calls_of(project_file.tree, name):
                fed = _fed_params(call, params, instances)
                instance_params.setdefault(edge.target, set()).update((defined, p) for p in fed)
                fed = _fed_params(call, params, optimizer_instances)
                optimizer_params.setdefault(edge.target, set()).update((defined, p) for p in fed)
                for instance, roles in helper_instances.items():
                    for p in _fed_params(call, params, {instance}):
                        helper_params.setdefault(edge.target, set()).update((defined, p, *r) for r in roles)
    paths = set(classes) | set(built) | set(instance_params) | set(helper_params)
    return {
        path: WrapperContext(
            classes=frozenset(classes.get(path, ())),
            built_elsewhere=frozenset(built.get(path, ())),
            instance_params=frozenset(instance_params.get(path, ())),
            optimizer_like=frozenset(optimizer_like.get(path, ())),
            optimizer_params=frozenset(optimizer_params.get(path, ())),
            helper_roles=frozenset(helper_roles.get(path, ())),
            helper_params=frozenset(helper_params.get(path, ())),
        )
        for path in sorted(paths)
    }


def _roles_of(helper_roles: Mapping[str, Set[Tuple[str, str, str]]], path: str, bound: str) -> List[Tuple[str, str]]:
    """``(method, role)`` of the AMP helper class that ``path`` calls ``bound`` (empty for another class)."""
    return sorted((method, role) for b, method, role in helper_roles.get(path, ()) if b == bound)


def _amp_helpers(files: Mapping[str, ProjectFile]) -> Set[Tuple[str, str]]:
    """(file, class name) of the AMP helper classes (:func:`~migrate.amp_helper_class.amp_helper_roles`)
    of files that build a GradScaler."""
    return {
        (path, node.name)
        for path, project_file in files.items()
        if project_file.tree is not None and "GradScaler" in project_file.source
        for node in ast.walk(project_file.tree)
        if isinstance(node, ast.ClassDef) and amp_helper_roles(node) is not None
    }


def _class(project_file: ProjectFile, name: str) -> ast.ClassDef:
    assert project_file.tree is not None
    return next(n for n in ast.walk(project_file.tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _function_named(project_file: ProjectFile, name: Optional[str]) -> Optional[ast.FunctionDef]:
    """The top-level function ``name`` of the file, else None."""
    if project_file.tree is None or name is None:
        return None
    return next((n for n in project_file.tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _defined_name(project_file: ProjectFile, bound: str, target: str) -> Optional[str]:
    """The name in ``target`` of what ``project_file`` calls ``bound`` (``m.f``: ``f``)."""
    if "." in bound:
        return bound.rsplit(".", 1)[1]
    return next((d for e in project_file.imports if e.target == target for b, d in e.names if b == bound), None)


def _library_wrapper_names(project_file: ProjectFile) -> Set[str]:
    """Names bound in the file to a library's loss-scaler wrapper the tool knows
    (``from timm.utils import NativeScaler``)."""
    if project_file.tree is None:
        return set()
    return {
        alias.asname or alias.name
        for node in ast.walk(project_file.tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
        for alias in node.names
        if f"{node.module}.{alias.name}" in LIBRARY_WRAPPERS
    }


def _instances(tree: ast.Module, classes: Set[str]) -> Dict[str, str]:
    """Names assigned a construction of one of ``classes`` (``C(...)`` or ``module.C(...)``,
    possibly ``... if c else None``) -> that class."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value.body if isinstance(node.value, ast.IfExp) else node.value
            called = ast_dotted(value.func) if isinstance(value, ast.Call) else None
            if called is not None and called in classes:
                found[node.targets[0].id] = called
    return found


def _imported_names(files: Mapping[str, ProjectFile], project_file: ProjectFile) -> List[Tuple[ImportEdge, str, str]]:
    """``(edge, name here, name there)`` for what the file imports from other given files:
    the names ``from m import f`` binds, and ``alias.f`` for each top-level function or class
    of a module imported as ``alias`` (``import util.misc as misc``)."""
    found = [(edge, bound, defined) for edge in project_file.imports for bound, defined in edge.names]
    for edge in project_file.imports:
        tree = files[edge.target].tree
        if edge.module_alias and tree is not None:
            functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
            found += [(edge, f"{edge.module_alias}.{name}", name) for name in functions]
    return found


def _calls_of(tree: ast.Module, name: str) -> List[ast.Call]:
    """Calls of ``name`` (``f`` or ``module.f``) in ``tree``."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast_dotted(n.func) == name]


def _fed_params(call: ast.Call, params: List[str], names: Set[str]) -> List[str]:
    """The ``params`` of the callee that ``call`` gives one of ``names``."""
    fed = [params[i] for i, a in enumerate(call.args) if i < len(params) and _is_name_in(a, names)]
    return fed + [k.arg for k in call.keywords if k.arg in params and _is_name_in(k.value, names)]


def _is_name_in(node: ast.expr, names: Set[str]) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def _name_wrapper_users(
    files: Mapping[str, ProjectFile],
    results: Dict[str, FileResult],
    wrappers: Mapping[Tuple[str, str], int],
    joined: Mapping[str, FrozenSet[str]],
) -> None:
    """A file using a loss-scaler wrapper of another given file is migrated or named. A file
    analysed with its bases' files as one module (``joined``: its group) is accounted for
    when that analysis refused nothing; where it refused a file of the group, it is named."""
    if not wrappers:
        return
    for path, project_file in files.items():
        result = results[path]
        if project_file.tree is None or result.changed or result.diagnostics:
            continue
        group = joined.get(path, frozenset())
        if group and not any(not d.is_info for other in group for d in results[other].diagnostics):
            continue
        for edge in project_file.imports:
            if results[edge.target].changed:
                continue  # its classes' steps were migrated (a trainer class): nothing to name
            used = [defined for _, defined in sorted(edge.names) if (edge.target, defined) in wrappers]
            if used:
                line = wrappers[(edge.target, used[0])]
                refused = [d for d in results[edge.target].diagnostics if not d.is_info]
                why = f", refused at {refused[0].path}:{refused[0].line} ({refused[0].code})" if refused else ""
                result.diagnostics.append(
                    Diagnostic(
                        path,
                        edge.line,
                        1,
                        "RPM111",
                        (
                            f"uses the class {used[0]} ({edge.target}:{line}), which scales a loss and calls "
                            f"backward and is not migrated{why}; migrate its training step by hand"
                        ),
                    )
                )
                break


def _keep_components_consistent(files: Mapping[str, ProjectFile], results: Dict[str, FileResult]) -> None:
    """Files that take part (changed, or reported) and import each other are migrated
    together or not at all."""
    taking_part = {p for p, r in results.items() if r.changed or any(not d.is_info for d in r.diagnostics)}
    neighbours: Dict[str, Set[str]] = {p: set() for p in taking_part}
    lines: Dict[Tuple[str, str], int] = {}
    for path in taking_part:
        for edge in files[path].imports:
            if edge.target in taking_part:
                neighbours[path].add(edge.target)
                neighbours[edge.target].add(path)
                lines.setdefault((path, edge.target), edge.line)
                lines.setdefault((edge.target, path), 1)
    seen: Set[str] = set()
    for start in sorted(taking_part):
        if start in seen:
            continue
        component, queue = [], [start]
        seen.add(start)
        while queue:
            current = queue.pop()
            component.append(current)
            for other in sorted(neighbours[current] - seen):
                seen.add(other)
                queue.append(other)
        blockers = [(p, d) for p in sorted(component) for d in results[p].diagnostics if not d.is_info]
        for path in component:
            elsewhere = [(p, d) for p, d in blockers if p != path]
            if results[path].changed and elsewhere:
                blocking_path, blocker = elsewhere[0]
                _refuse(
                    results[path],
                    _line_towards(path, component, lines),
                    (
                        f"left unchanged because {blocking_path}:{blocker.line} ({blocker.code}) is not "
                        "migrated and this file takes part in the same training program"
                    ),
                )


def _line_towards(path: str, component: List[str], lines: Dict[Tuple[str, str], int]) -> int:
    """The line of ``path``'s first import of another file of the component, else 1."""
    found = [lines[(path, other)] for other in component if (path, other) in lines and lines[(path, other)] > 1]
    return min(found) if found else 1
