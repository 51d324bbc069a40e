"""The structure of the codemod cannot silently rot: every module of ``migrate`` imports on
its own (no import cycle at module level, whatever is imported first), and every rule of
``migrate/rules/`` names the modules that hold its code, its own module first when the
rewrite lives there."""

import ast
import pathlib
import subprocess
import sys

import pytest

from migrate.rules import all_rules

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "migrate"
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for path in PACKAGE.rglob("*.py")
)


def _module_path(module: str) -> pathlib.Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _runtime_imports(module: str) -> set:
    """The migrate modules ``module`` imports when it is loaded (its top-level imports,
    not those under ``if TYPE_CHECKING:`` nor inside functions)."""
    path = _module_path(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("migrate")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("migrate"):
            found.add(node.module)
    parents = {target.rpartition(".")[0] for target in found if target.count(".") > 1}
    return {target for target in found | parents if target in MODULES and target != module}


def test_migrate_modules_import_without_cycles():
    graph = {module: _runtime_imports(module) for module in MODULES}
    done, path = set(), []

    def visit(module: str) -> None:
        if module in path:
            cycle = path[path.index(module) :] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in MODULES:
        visit(module)
    assert graph["migrate.steps"] >= {"migrate.rules.loss_function", "migrate.rules.step_function"}  # not vacuous


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
