"""roundpipe-migrate on several files as one program (migrate.project): expected outcomes of
the fixture projects, the all-or-nothing guarantee (also under mutation), and a migrated
two-file trainer that runs and prints the original's numbers."""

import contextlib
import io
import pathlib
import runpy
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.engine import migrate_source
from migrate.project import migrate_project, project_view
from mutations import MUTATIONS, mutate_lines

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "tests" / "migrate_cases" / "projects"
NAMES = sorted(p.name for p in PROJECTS.iterdir() if p.is_dir())

#: project -> file -> (status, diagnostic codes)
OUTCOMES = {
    "checkpoint_refused": {"train.py": ("partial", ["RPM110"]), "checkpoint.py": ("partial", ["RPM104"])},
    "model_handed_across": {"train.py": ("partial", ["RPM110"]), "evaluation.py": ("unchanged", [])},
    "scaler_wrapper": {"main.py": ("partial", ["RPM111"]), "amp_utils.py": ("partial", ["RPM110"])},
    "split_trainer": {"train.py": ("migrated", []), "models.py": ("unchanged", [])},
}


def _sources(name):
    return {p.name: p.read_text() for p in sorted((PROJECTS / name).glob("*.py"))}


def _refused(result):
    return any(not d.is_info for d in result.diagnostics)


def _assert_never_half_migrated(sources, results):
    """No file is changed while a file it imports, or that imports it, is refused."""
    for path, project_file in project_view(sources).items():
        for edge in project_file.imports:
            pair = (results[path], results[edge.target])
            assert not (pair[0].changed and _refused(pair[1])), (path, edge.target)
            assert not (pair[1].changed and _refused(pair[0])), (edge.target, path)


def test_every_fixture_project_has_its_expected_outcome():
    assert sorted(OUTCOMES) == NAMES
    for name in NAMES:
        results = migrate_project(_sources(name))
        got = {path: (r.status, [d.code for d in r.diagnostics]) for path, r in results.items()}
        assert got == OUTCOMES[name], name
        for path, result in results.items():
            expected = PROJECTS / name / "expected" / path
            assert result.migrated == (expected.read_text() if expected.exists() else result.original)


@pytest.mark.parametrize("name", NAMES)
def test_no_file_changes_while_another_file_of_the_program_is_refused(name):
    sources = _sources(name)
    results = migrate_project(sources)
    _assert_never_half_migrated(sources, results)
    if any(_refused(r) for r in results.values()):  # each fixture project is one program
        assert not any(r.changed for r in results.values())


def test_the_consistency_rule_is_what_refuses_the_importing_file():
    """train.py of checkpoint_refused migrates on its own; only the project view refuses it,
    naming the blocking file and line."""
    sources = _sources("checkpoint_refused")
    assert migrate_source(sources["train.py"], "train.py").status == "migrated"
    diagnostic = migrate_project(sources)["train.py"].diagnostics[0]
    assert "checkpoint.py:21 (RPM104)" in diagnostic.message and diagnostic.line == 7


def test_project_migration_is_idempotent():
    for name in NAMES:
        once = migrate_project(_sources(name))
        twice = migrate_project({p: r.migrated for p, r in once.items()})
        assert all(twice[p].migrated == once[p].migrated for p in once)
        assert all(not twice[p].diagnostics for p in once if once[p].changed)


def test_a_file_that_does_not_parse_is_reported_without_any_amp_marker():
    results = migrate_project({"ok.py": "x = 1\n", "broken.py": "def f(:\n    pass\n"})
    assert [d.code for d in results["broken.py"].diagnostics] == ["RPM901"]
    assert results["broken.py"].status == "error" and results["ok.py"].status == "unchanged"


def test_relative_and_package_imports_are_resolved():
    view = project_view(
        {
            "pkg/__init__.py": "",
            "pkg/engine.py": "from .utils import helper\nfrom . import models\n",
            "pkg/utils.py": "def helper():\n    pass\n",
            "pkg/models.py": "",
            "main.py": "import pkg.engine as engine\nfrom pkg.utils import helper\n",
        }
    )
    assert {(e.target, e.names) for e in view["pkg/engine.py"].imports} == {
        ("pkg/utils.py", (("helper", "helper"),)),
        ("pkg/models.py", ()),
    }
    assert {e.target for e in view["main.py"].imports} == {"pkg/engine.py", "pkg/utils.py"}


def test_migrated_two_file_trainer_prints_the_originals_numbers(tmp_path, monkeypatch):
    sources = _sources("split_trainer")

    def run(files, folder):
        folder.mkdir()
        for path, text in files.items():
            (folder / path).write_text(text)
        monkeypatch.syspath_prepend(str(folder))
        sys.modules.pop("models", None)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(folder / "train.py"), run_name="__main__")
        return out.getvalue()

    original = run(sources, tmp_path / "original")
    exact = {p: r.migrated for p, r in migrate_project(sources, exact=True).items()}
    assert exact["train.py"] != sources["train.py"] and exact["models.py"] == sources["models.py"]
    assert run(exact, tmp_path / "exact") == original
    default = {p: r.migrated for p, r in migrate_project(sources).items()}
    assert run(default, tmp_path / "default").count("step ") == original.count("step ") == 8


def _project_mutations():
    def mutate(name):
        sources = _sources(name)
        path = st.sampled_from(sorted(sources))
        ops = st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 200)), min_size=1, max_size=3)
        return st.tuples(st.just(sources), path, ops)

    return st.sampled_from(NAMES).flatmap(mutate)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_project_mutations())
def test_mutated_projects_compile_stay_consistent_and_are_idempotent(case):
    sources, path, ops = case
    sources = {**sources, path: mutate_lines(sources[path].splitlines(True), ops)}
    results = migrate_project(sources)
    _assert_never_half_migrated(sources, results)
    for name, result in results.items():
        if result.changed:
            compile(result.migrated, name, "exec")
        else:
            assert result.migrated == sources[name]
    again = migrate_project({p: r.migrated for p, r in results.items()})
    assert all(again[p].migrated == results[p].migrated for p in results)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_command_line_applies_the_project_rule_with_and_without_workers(tmp_path, jobs):
    """roundpipe-migrate -w on the checkpoint_refused project writes nothing: train.py would
    migrate alone, but checkpoint.py (which it imports) is refused, so both stay as they were."""
    import shutil

    from migrate.cli import main

    project = tmp_path / "project"
    shutil.copytree(PROJECTS / "checkpoint_refused", project)
    before = {p.name: p.read_bytes() for p in project.glob("*.py")}
    assert main(["-w", "-j", jobs, "-q", str(project)]) == 1
    assert {p.name: p.read_bytes() for p in project.glob("*.py")} == before


def test_a_training_function_given_a_builtin_is_migrated_not_crashed():
    """A parameter its callers feed a builtin (``train(print, model, ...)``) has no binding
    in the file; following the model's parameters past it must not crash the engine."""
    from migrate.engine import migrate_source

    source = (
        "import torch\n\n\n"
        "def train(log, model, optimizer, scaler, batches):\n"
        "    for x, y in batches:\n"
        '        with torch.autocast("cpu", dtype=torch.bfloat16):\n'
        "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        scaler.scale(loss).backward()\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n"
        "        optimizer.zero_grad()\n"
        "        log(loss.item())\n\n\n"
        "def main(batches):\n"
        "    model = torch.nn.Linear(4, 2)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        '    scaler = torch.amp.GradScaler("cpu")\n'
        "    train(print, model, optimizer, scaler, batches)\n"
    )
    result = migrate_source(source, "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert "model.step(_step_fn)" in result.migrated


#: fixture project of tests/migrate_projects -> file -> (status, diagnostic codes), for MAE's
#: three-file layout with the wrapper class spelled through an alias
WRAPPER_ALIASES = {
    "mae_wrapper_alias": {  # `from util.misc import NativeScalerWithGradNormCount as NativeScaler`
        "main.py": ("partial", ["RPM114"]),
        "engine.py": ("partial", ["RPM110"]),
        "util/misc.py": ("partial", ["RPM110"]),
    },
    "mae_wrapper_module_alias": {  # `import util.misc as misc`; `misc.NativeScalerWithGradNormCount()`
        "main.py": ("migrated", []),
        "engine.py": ("migrated", []),
        "util/misc.py": ("migrated", []),
    },
}


@pytest.mark.parametrize("name", sorted(WRAPPER_ALIASES))
def test_a_wrapper_class_spelled_through_an_alias_migrates_its_three_files_together(name):
    """The class, its construction and its call site migrate together, or none of them does
    and each names the blocker (the test_migrate_projects harness runs the migrated one)."""
    folder = ROOT / "tests" / "migrate_projects" / name
    sources = {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.py"))}
    results = migrate_project(sources)
    got = {path: (r.status, [d.code for d in r.diagnostics]) for path, r in results.items() if r.status != "unchanged"}
    assert got == WRAPPER_ALIASES[name]
