"""A trainer instance's model and optimizer used from outside its class (issue 10, shape 1).

The script driving a trainer reads and writes what its step works on through the instance
(``trainer.optimizer.param_groups[0]["lr"]``, ``trainer.model.parameters()``, a checkpoint
of ``trainer.model.state_dict()``/``trainer.optimizer.state_dict()``, an lr write). Those
uses get what the class's own uses get, through the instance (:mod:`migrate.instance_outside`),
whether the script is the class's own file or another given file
(tests/migrate_projects/trainer_outside_reads). The programs train one step per epoch, so
that with every read waiting for the running step the asynchronous form prints exactly the
original's numbers; they run with a slowed optimizer step, under which a read that does not
wait sees the weights and momentum of the step before.
"""

import pathlib

import pytest

from migrate.engine import migrate_source
from migrate.project import migrate_project
from script_runs import run_script
from test_migrate_projects import PROJECTS_ROOT, run_program

PROJECT = PROJECTS_ROOT / "trainer_outside_reads"
WAIT = "trainer.model.synchronize()"
# the project's two files as one script: the class and the loop driving it in one file
ONE_FILE = (PROJECT / "trainer.py").read_text() + (PROJECT / "main.py").read_text().replace(
    "from trainer import Trainer\n", ""
)


def _migrated(source: str, exact: bool = False) -> str:
    result = migrate_source(source, "train.py", exact=exact)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert migrate_source(result.migrated, "train.py", exact=exact).migrated == result.migrated  # idempotent
    return result.migrated


def _read_values(output: str) -> str:
    """What the program printed but its last line: the asynchronous form's final scale is the
    thread-aware scaler's answer to the main thread (one update behind, as in the class)."""
    assert output.splitlines()[-1].startswith("final scale ")
    return "".join(output.splitlines(keepends=True)[:-1])


def _without_waits(source: str) -> str:
    return "".join(line for line in source.splitlines(keepends=True) if line.strip() != WAIT)


def test_reads_through_the_instance_get_the_class_own_treatment():
    migrated = _migrated(ONE_FILE)
    assert f'        {WAIT}\n        lr = trainer.optimizer.param_groups[0]["lr"]\n' in migrated
    assert '                "model": trainer.model.model.state_dict(),\n' in migrated  # the module's own keys
    assert "        count = sum(p.numel() for p in trainer.model.parameters())\n" in migrated  # in a training loop
    assert f'            {WAIT}\n            trainer.optimizer.param_groups[0]["lr"] = 0.05' in migrated
    assert "    model.synchronize()\n    model.eval()\n" in migrated  # followed into the function it is handed to
    exact = _migrated(ONE_FILE, exact=True)  # a synchronous step has finished: only the checkpoint waits,
    assert exact.count(WAIT) == 1 and f"        {WAIT}\n        torch.save(" in exact  # as the class's own would


def test_the_exact_form_prints_the_original_numbers(tmp_path):
    original = run_script(ONE_FILE, tmp_path, "original.py")
    assert run_script(_migrated(ONE_FILE, exact=True), tmp_path, "exact.py") == original


def test_the_asynchronous_form_waits_for_the_running_step(slow_step, tmp_path):
    original = _read_values(run_script(ONE_FILE, tmp_path, "original.py"))
    migrated = _migrated(ONE_FILE)
    assert _read_values(run_script(migrated, tmp_path, "async.py")) == original
    # without the waits the checkpoint holds the weights and momentum of the step before
    assert _read_values(run_script(_without_waits(migrated), tmp_path, "racing.py")) != original


def _project(tmp_path: pathlib.Path, name: str, sources: dict) -> pathlib.Path:
    folder = tmp_path / name
    folder.mkdir()
    for path, text in sources.items():
        (folder / path).write_text(text)
    return folder


def test_a_script_of_another_file_is_migrated_with_the_class(slow_step, tmp_path):
    sources = {path: (PROJECT / path).read_text() for path in ("main.py", "trainer.py")}
    results = migrate_project(sources)
    assert all(r.changed and not r.diagnostics for r in results.values()), {
        p: [d.format() for d in r.diagnostics] for p, r in results.items()
    }
    assert f"        {WAIT}\n        lr = trainer.optimizer" in results["main.py"].migrated
    assert "trainer.model.model.state_dict()" in results["main.py"].migrated
    original = _read_values(run_program(_project(tmp_path, "original", sources)))
    migrated = {path: r.migrated for path, r in results.items()}
    assert _read_values(run_program(_project(tmp_path, "async", migrated))) == original
    again = migrate_project(migrated)
    assert not any(r.changed or r.diagnostics for r in again.values())  # idempotent


def test_an_instance_handed_to_a_function_of_a_third_file_stays_refused():
    sources = {path: (PROJECT / path).read_text() for path in ("main.py", "trainer.py")}
    sources["report.py"] = 'def report(t):\n    print(t.optimizer.param_groups[0]["lr"])\n'
    sources["main.py"] = (
        sources["main.py"]
        .replace("from trainer import Trainer\n", "from report import report\nfrom trainer import Trainer\n")
        .replace("        trainer.scheduler.step()\n", "        report(trainer)\n        trainer.scheduler.step()\n")
    )
    results = migrate_project(sources)
    assert not any(r.changed for r in results.values())
    message = next(d.message for d in results["trainer.py"].diagnostics)
    assert "report.py:2 reads it (`t.optimizer`) through the instance" in message


NEAR_MISSES = {
    "held in a container": "runs = [trainer]\n        print(runs[0].optimizer.param_groups[0]['lr'])",
    "handed to a parameter": "show(trainer)",
    "read by name": "print(getattr(trainer, 'optimizer').param_groups[0]['lr'])",
    "another name for it": "other = trainer\n        print(other.optimizer.param_groups[0]['lr'])",
    "an optimizer step of its own": "trainer.optimizer.step()",
    "the model stored": "models = [trainer.model]",
    "the model under another name": "net = trainer.model\n        print(net.training)",
    "a condition reading the lr": "if trainer.optimizer.param_groups[0]['lr'] < 0.1:\n            print('low')",
}
HELPERS = "def show(t):\n    print(t.optimizer.param_groups[0]['lr'])\n\n\ndef main():"


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_uses_the_migration_cannot_follow_stay_refused(name):
    use = NEAR_MISSES[name]
    source = ONE_FILE.replace("def main():", HELPERS).replace(
        "        trainer.scheduler.step()\n", f"        {use}\n        trainer.scheduler.step()\n"
    )
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM120"], [d.format() for d in result.diagnostics]
