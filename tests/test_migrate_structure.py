"""The structure of the codemod cannot silently rot: the modules of ``migrate`` import each
other without a cycle (counting the imports inside functions, which would otherwise only
hide one), every module imports on its own whatever is imported first, every rule of
``migrate/rules/`` names the modules that hold its code, its own module first when the
rewrite lives there, and the step rules are handed the recognised step as one frozen value
(:class:`migrate.recognised.RecognisedStep`), not as long argument lists."""

import ast
import dataclasses
import pathlib
import subprocess
import sys
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

import libcst as cst
import pytest

from migrate.recognised import RecognisedStep, StepGroup
from migrate.rules import all_rules

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "migrate"
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for path in PACKAGE.rglob("*.py")
)


def _module_path(module: str) -> pathlib.Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


#: modules whose imports inside functions defer loading for start-up time, not to break a
#: cycle: the command line keeps ``--help`` fast (issue 14) by importing the engine, the worker
#: pool and the project view only when a run needs them
_DEFERRED_FOR_START_UP = frozenset({"migrate.cli"})


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports_of(nodes: Iterable[ast.AST], in_function: bool = False) -> Iterator[Tuple[ast.stmt, bool]]:
    """Every import statement in ``nodes`` with whether it runs inside a function, leaving out
    those under ``if TYPE_CHECKING:`` (which never run)."""
    for node in nodes:
        if _is_type_checking(node):
            assert isinstance(node, ast.If)
            yield from _imports_of(node.orelse, in_function)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _imports_of(ast.iter_child_nodes(node), inner)


def _runtime_imports(module: str, source: str) -> Dict[str, int]:
    """The migrate modules ``module`` (of text ``source``) imports when it runs, each with the
    line of its first import: at the top level and inside functions alike, not under
    ``if TYPE_CHECKING:``, nor those a module of :data:`_DEFERRED_FOR_START_UP` makes inside
    its functions."""
    is_package = _module_path(module).name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: Dict[str, int] = {}
    for node, in_function in _imports_of(ast.parse(source).body):
        if in_function and module in _DEFERRED_FOR_START_UP:
            continue
        targets = set()
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            targets.add(target)
            targets |= {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES}
        elif isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names if alias.name.startswith("migrate")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("migrate"):
            targets.add(node.module or "")
        targets |= {target.rpartition(".")[0] for target in targets if target.count(".") > 1}
        for target in sorted(targets):
            if target in MODULES and target != module:
                found.setdefault(target, node.lineno)
    return found


def _import_cycle(graph: Dict[str, Dict[str, int]]) -> Optional[str]:
    """A cycle of ``graph`` (module -> {imported module: line}), spelled with the line of each
    import (``a -> (line 3) b -> (line 40) a``); None when it is acyclic."""
    done: Set[str] = set()
    path: List[str] = []

    def visit(module: str) -> Optional[str]:
        if module in path:
            cycle = path[path.index(module) :] + [module]
            steps = [f"{a} -> (line {graph[a][b]}) " for a, b in zip(cycle, cycle[1:])]
            return "".join(steps) + module
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            cycle = visit(target)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle is not None:
            return cycle
    return None


def test_migrate_modules_import_without_cycles():
    graph = {module: _runtime_imports(module, _module_path(module).read_text()) for module in MODULES}
    cycle = _import_cycle(graph)
    assert cycle is None, f"import cycle between migrate modules (imports inside functions count): {cycle}"
    assert set(graph["migrate.steps"]) >= {"migrate.rules.loss_function", "migrate.rules.step_function"}


def test_the_cycle_check_counts_imports_inside_functions_only_where_they_run():
    inner = "from .plan import Blocked\n\ndef f():\n    from .steps import StepBuilder\n"
    checked = "if TYPE_CHECKING:\n    from .plan import Plan\nelse:\n    from . import syntax\n"
    assert _runtime_imports("migrate.origins", inner) == {"migrate.plan": 1, "migrate.steps": 4}
    assert _runtime_imports("migrate.origins", checked) == {"migrate": 4, "migrate.syntax": 4}
    assert _runtime_imports("migrate.cli", inner) == {"migrate.plan": 1}  # deferred for start-up
    graph = {"migrate.origins": {"migrate.steps": 4}, "migrate.steps": {"migrate.origins": 9}}
    assert _import_cycle(graph) == "migrate.origins -> (line 4) migrate.steps -> (line 9) migrate.origins"
    assert _import_cycle({"migrate.origins": {"migrate.steps": 4}, "migrate.steps": {}}) is None


_FRESH_IMPORTS = """
import importlib, random, sys
modules = sys.argv[1:]
random.Random(9).shuffle(modules)
for module in modules:
    importlib.import_module(module)
print(len(modules))
"""


def test_every_migrate_module_imports_in_a_random_order_in_a_fresh_interpreter():
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_IMPORTS, *MODULES], cwd=ROOT, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(MODULES))]


def _defines_functions(path: pathlib.Path) -> bool:
    return any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) for node in ast.parse(path.read_text()).body)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda rule: rule.name)
def test_rule_names_the_modules_holding_its_code(rule):
    own = f"rules/{rule.name}.py"
    assert (PACKAGE / own).exists(), f"the rule {rule.name!r} has no module {own}"
    for module in rule.implemented_in:
        assert (PACKAGE / module).is_file(), f"{rule.name}: implemented_in names a missing module {module}"
    assert len(set(rule.implemented_in)) == len(rule.implemented_in), rule.implemented_in
    # a rule module holding rewrite code names itself first; one holding only its
    # description and examples names the engine modules that do the work, not itself
    if _defines_functions(PACKAGE / own):
        assert rule.implemented_in[0] == own, f"{rule.name}: its code is in {own}, which implemented_in must name first"
    else:
        assert own not in rule.implemented_in, f"{rule.name}: {own} holds no code"


#: the entry points of the step rules (and their helpers that read the whole step): each
#: takes the recognised step as one frozen value besides its context, not its group, optimizer
#: and model apart
_TAKE_THE_RECOGNISED_STEP = {
    "rules/step_function.py": ("plan_step_group", "zero_grads_to_move", "group_edits"),
    "rules/autograd_form.py": ("plan_autograd_form",),
    "rules/optimizer_writes.py": ("order_optimizer_writes",),
    "rules/loss_function.py": ("forward_region",),
    "multi_step.py": ("own_statements", "zero_models_in_place"),
    "split_step.py": ("plan_detached",),
    "split_functions.py": ("plan_detached_function",),
    "steps.py": ("plan_autograd_form",),  # the StepBuilder hook the split and joint steps call
}


def _annotated_parameters(function: ast.FunctionDef) -> Dict[str, str]:
    """The parameters of ``function`` but ``self``, each with its annotation's text."""
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    return {
        a.arg: ast.unparse(a.annotation).strip("'\"") if a.annotation is not None else ""
        for a in every
        if a.arg != "self"
    }


def _functions(path: pathlib.Path) -> Iterator[ast.FunctionDef]:
    return (node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef))


@pytest.mark.parametrize(
    "module, name", [(module, name) for module, names in _TAKE_THE_RECOGNISED_STEP.items() for name in names]
)
def test_step_rule_entry_points_take_the_frozen_recognised_step(module, name):
    defined = [f for f in _functions(PACKAGE / module) if f.name == name]
    assert len(defined) == 1, f"{module} defines {name} {len(defined)} times"
    parameters = _annotated_parameters(defined[0])
    assert "RecognisedStep" in parameters.values(), f"{module}: {name}{tuple(parameters)} takes no RecognisedStep"
    apart = sorted({"found", "optimizer", "model"} & set(parameters))
    assert not apart, f"{module}: {name} takes {apart} apart from its RecognisedStep"
    assert len(parameters) <= 4, f"{module}: {name}{tuple(parameters)}: the context and at most three more"


def test_no_function_takes_a_step_group_with_its_optimizer_and_model_apart():
    apart = [
        f"{path.relative_to(ROOT)}:{function.lineno} {function.name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for function in _functions(path)
        if "StepGroup" in _annotated_parameters(function).values()
        and {"optimizer", "model"} <= set(_annotated_parameters(function))
    ]
    assert not apart, f"take a RecognisedStep (migrate/recognised.py) instead: {apart}"


def test_the_recognised_step_is_frozen():
    recognised = RecognisedStep(StepGroup(cst.Module([]), 0, 0, (), None), "optimizer", "model")
    with pytest.raises(dataclasses.FrozenInstanceError):
        recognised.model = "other"  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(RecognisedStep)] == ["group", "optimizer", "model"]
