"""A step split over two functions that are handed the scaler (issue 10, shape 3):
migrate.split_functions, in one file and across files (migrate.joined_classes.call_groups).
The migrated programs print exactly the original's numbers under --exact; every shape the
rule cannot prove sound is refused, with nothing changed."""

import pathlib
import textwrap

import pytest

from migrate.engine import migrate_source
from migrate.project import migrate_project
from script_runs import run_python

AMP_SETUP = textwrap.dedent(
    """\
    import torch


    def setup_amp(init_scale):
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)
        return scaler
    """
)

STEPS = textwrap.dedent(
    """\
    import torch


    def backward_step(loss, grad_scaler):
        grad_scaler.scale(loss).backward()


    def optimizer_step(optimizer, grad_scaler, model, max_norm=None):
        if max_norm is not None:
            grad_scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        grad_scaler.step(optimizer)
        grad_scaler.update()
        optimizer.zero_grad(set_to_none=True)
    """
)

LOOP = textwrap.dedent(
    """\
    def main():
        torch.manual_seed(0)
        scaler = setup_amp(64.0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(3)
        for step in range(6):
            x = torch.randn(6, 4, generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            backward_step(loss, scaler)
            optimizer_step(optimizer, scaler, model, max_norm=1.0)
            print(f"step {step} loss {loss.item()!r}")
        print(f"final scale {scaler.get_scale()!r}")


    if __name__ == "__main__":
        main()
    """
)

ONE_FILE = AMP_SETUP + "\n\n" + STEPS.replace("import torch\n", "") + "\n\n" + LOOP
MAIN = "import torch\n\nfrom amp_setup import setup_amp\nfrom steps import backward_step, optimizer_step\n\n\n" + LOOP


def _run(folder: pathlib.Path) -> str:
    """What ``python main.py`` in ``folder`` prints (it must exit 0)."""
    done = run_python(["main.py"], cwd=folder, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _write(folder: pathlib.Path, sources: dict) -> pathlib.Path:
    folder.mkdir()
    for name, text in sources.items():
        (folder / name).write_text(text)
    return folder


def _codes(result):
    return [d.code for d in result.diagnostics if not d.is_info]


@pytest.mark.slow
def test_one_file_split_over_functions_prints_the_originals_numbers(tmp_path):
    result = migrate_source(ONE_FILE, "main.py", exact=True)
    assert _codes(result) == [] and result.changed
    assert "model.step(_step_fn, is_async=False)\n    grad_scaler.update()\n" in result.migrated
    assert "clip_grad_norm_(model.optim_parameters(), max_norm)" in result.migrated
    assert "def backward_step(loss, grad_scaler):\n    grad_scaler.scale(loss).backward()\n" in result.migrated
    again = migrate_source(result.migrated, "main.py", exact=True)
    assert not again.changed and again.diagnostics == []
    original = _run(_write(tmp_path / "original", {"main.py": ONE_FILE}))
    assert original.count("step ") == 6
    assert _run(_write(tmp_path / "migrated", {"main.py": result.migrated})) == original


@pytest.mark.slow
def test_helpers_of_other_files_are_migrated_with_their_caller_to_the_same_numbers(tmp_path):
    sources = {"amp_setup.py": AMP_SETUP, "steps.py": STEPS, "main.py": MAIN}
    results = migrate_project(sources, exact=True)
    assert {path: (r.status, _codes(r)) for path, r in results.items()} == {path: ("migrated", []) for path in sources}
    assert "roundpipe.GradScaler(init_scale=init_scale" in results["amp_setup.py"].migrated
    assert "model = roundpipe.RoundPipe(" in results["main.py"].migrated
    assert "model.step(_step_fn, is_async=False)" in results["steps.py"].migrated
    migrated = {path: r.migrated for path, r in results.items()}
    assert all(not r.changed for r in migrate_project(migrated, exact=True).values())
    original = _run(_write(tmp_path / "original", sources))
    assert _run(_write(tmp_path / "migrated", migrated)) == original
    asynchronous = {path: r.migrated for path, r in migrate_project(sources).items()}
    assert "model.step(_step_fn)\n" in asynchronous["steps.py"]
    assert _run(_write(tmp_path / "asynchronous", asynchronous)).count("step ") == 6


@pytest.mark.parametrize(
    "change, code",
    [
        (  # another caller hands the step helper another scaler
            (
                "        backward_step(loss, scaler)\n",
                "        other = object()\n        backward_step(loss, scaler)\n"
                "        optimizer_step(optimizer, other, model)\n",
            ),
            "RPM107",
        ),
        (
            ("    for step in range(6):", "    hooks = [optimizer_step]\n    for step in range(6):"),
            "RPM106",
        ),
        (
            (
                "        backward_step(loss, scaler)\n",
                "        backward_step(loss, scaler)\n        optimizer.zero_grad()\n",
            ),
            "RPM106",
        ),
    ],
    ids=["another-scaler", "helper-as-value", "zero-grad-between"],
)
def test_a_split_that_cannot_be_followed_soundly_is_refused_untouched(change, code):
    source = ONE_FILE.replace(*change)
    assert source != ONE_FILE
    result = migrate_source(source, "main.py", exact=True)
    assert not result.changed
    assert code in _codes(result), result.diagnostics


def test_asynchronous_form_refuses_a_learning_rate_write_by_the_caller_and_exact_migrates_it():
    source = ONE_FILE.replace(
        '        print(f"step',
        '        for group in optimizer.param_groups:\n            group["lr"] *= 0.9\n        print(f"step',
    )
    refused = migrate_source(source, "main.py")
    assert not refused.changed and "RPM106" in _codes(refused)
    assert "param_groups" in next(d.message for d in refused.diagnostics if d.code == "RPM106")
    assert migrate_source(source, "main.py", exact=True).changed


def test_asynchronous_form_refuses_a_learning_rate_write_beside_the_step_group():
    source = ONE_FILE.replace(
        "    if max_norm is not None:\n", '    optimizer.param_groups[0]["lr"] = 0.05\n    if max_norm is not None:\n'
    )
    assert source != ONE_FILE
    refused = migrate_source(source, "main.py")
    assert not refused.changed and "RPM106" in _codes(refused)
    assert migrate_source(source, "main.py", exact=True).changed


def test_helpers_called_from_another_file_too_are_not_joined():
    other = "from steps import optimizer_step\n\n\ndef tune(model, opt):\n    optimizer_step(opt, None, model)\n"
    sources = {"amp_setup.py": AMP_SETUP, "steps.py": STEPS, "main.py": MAIN, "tune.py": other}
    results = migrate_project(sources, exact=True)
    assert not any(r.changed for r in results.values())
    assert "RPM104" in _codes(results["steps.py"])


def test_a_zero_grad_between_the_two_helpers_is_refused_at_the_call():
    source = ONE_FILE.replace(
        "        backward_step(loss, scaler)\n", "        backward_step(loss, scaler)\n        optimizer.zero_grad()\n"
    )
    line = source.splitlines().index("        backward_step(loss, scaler)") + 2
    result = migrate_source(source, "main.py", exact=True)
    assert (
        f"main.py:{line}:9: RPM106 `optimizer.zero_grad()` empties gradients outside optimizer_step(), which holds "
        "the optimizer step of a step split over functions; the step function cannot keep it in its place; left "
        "untouched" in [d.format() for d in result.diagnostics]
    )
