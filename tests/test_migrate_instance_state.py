"""A trainer class of one file whose instance another file uses: reads of the optimizer, the
scheduler or the model through the instance after the asynchronous step would race with it
(migrate.instance_state). Read directly by the file building the instance, the two files are
analysed as one and each read waits for the step (migrate.instance_outside); read in a
function the instance is handed to, the default form refuses the program as a whole.
--exact migrates it and prints the original's numbers."""

import sys

import pytest

from migrate.project import migrate_project
from script_runs import run_script

TRAINER = """import torch
import torch.nn as nn


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.7)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
        self.ema = [p.detach().clone() for p in self.model.parameters()]

    def train_step(self, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(self.model(x).float(), y)
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss
"""

MAIN = """import torch
from trainer import Trainer


def main():
    tr = Trainer()
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        x = torch.randn(8, 4, generator=g)
        loss = tr.train_step(x, x[:, :1] * 2)
        USE
        print(f"step {step} loss {loss.item()!r}")
    print("scale", tr.scaler.get_scale())


if __name__ == "__main__":
    main()
"""

USES = {
    "scheduler step": "tr.sched.step()",
    "lr write": 'tr.opt.param_groups[0]["lr"] = 0.05',
    "optimizer state": "print(len(tr.opt.state_dict()['state']))",
    "weights built from the model": "print(float(tr.ema[0].sum()))",
}


def _files(use: str) -> dict:
    return {"trainer.py": TRAINER, "main.py": MAIN.replace("USE", use)}


def _line(source: str, text: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if text in line)


def _run(texts: dict, folder) -> str:
    """What ``texts``' main.py prints, its trainer.py importable."""
    folder.mkdir()
    (folder / "trainer.py").write_text(texts["trainer.py"])
    sys.path.insert(0, str(folder))
    try:
        return run_script(texts["main.py"], folder, "main.py")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("trainer", None)


@pytest.mark.parametrize("use", USES.values(), ids=USES.keys())
def test_state_of_the_step_read_through_an_instance_of_another_file_waits_for_the_step(use, slow_step, tmp_path):
    files = _files(use)
    results = migrate_project(files)
    assert all(r.changed and not r.diagnostics for r in results.values())
    assert f"        tr.model.synchronize()\n        {use}\n" in results["main.py"].migrated
    original = _run(files, tmp_path / "original").splitlines()
    migrated = _run({p: r.migrated for p, r in results.items()}, tmp_path / "async").splitlines()
    assert migrated[:-1] == original[:-1] and original[-1].startswith("scale")  # the scale: one update behind


def test_a_caller_that_only_calls_the_trainer_and_reads_the_scaler_still_migrates():
    results = migrate_project(_files("pass"))
    assert results["trainer.py"].status == "migrated"
    assert "self.model.step(_step_fn)" in results["trainer.py"].migrated


def test_the_exact_form_migrates_such_a_caller_and_prints_the_same_numbers(tmp_path):
    files = _files(USES["scheduler step"] + "\n        " + USES["lr write"])
    results = migrate_project(files, exact=True)
    assert results["trainer.py"].status == "migrated" and not results["main.py"].changed

    original = _run(files, tmp_path / "original")
    assert original.count("step ") == 4
    assert _run({p: r.migrated for p, r in results.items()}, tmp_path / "exact") == original


HANDED = {
    "a function of the file": ("def log_state(t):\n    print(t.opt.param_groups[0]['lr'])\n", "log_state(tr)"),
    "a method": ("class Logger:\n    def log(self, t):\n        t.sched.step()\n", "Logger().log(tr)"),
    "a keyword argument": (
        "def log_state(step, t=None):\n    print(step, t.opt.state_dict())\n",
        "log_state(step, t=tr)",
    ),
    "a function of another file": ("from logs import log_state\n", "log_state(tr)"),
}
LOGS = "def log_state(t):\n    print(len(t.opt.state_dict()['state']))\n"


@pytest.mark.parametrize("helper, call", HANDED.values(), ids=HANDED.keys())
def test_state_of_the_step_read_in_a_function_the_instance_is_handed_to_refuses_the_program(helper, call):
    main = MAIN.replace("USE", call).replace("from trainer import Trainer\n", f"from trainer import Trainer\n{helper}")
    results = migrate_project({"trainer.py": TRAINER, "main.py": main, "logs.py": LOGS})
    assert not any(r.changed for r in results.values())
    [diagnostic] = results["trainer.py"].diagnostics
    assert (diagnostic.code, diagnostic.line) == ("RPM110", _line(TRAINER, "class Trainer"))
    where = "logs.py" if "logs" in helper else "main.py"
    source = LOGS if "logs" in helper else main
    read = next(line for line in source.splitlines() if "t.opt" in line or "t.sched" in line)
    assert f"{where}:{_line(source, read)} reads it" in diagnostic.message
    assert f"main.py:{_line(main, call)} hands to" in diagnostic.message


def test_a_function_handed_the_instance_that_reads_only_the_scaler_still_migrates():
    main = MAIN.replace("USE", "show(tr)").replace(
        "from trainer import Trainer\n",
        "from trainer import Trainer\n\n\ndef show(t):\n    print(t.scaler.get_scale())\n",
    )
    results = migrate_project({"trainer.py": TRAINER, "main.py": main})
    assert results["trainer.py"].status == "migrated"
