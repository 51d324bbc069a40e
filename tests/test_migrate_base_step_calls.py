"""A subclass whose overriding step method runs the base class's step itself: through the
base class's name (``Trainer.train_step(self, ...)``), a module-level alias of it,
``super()`` with other arguments, or ``super(Cls, self)`` with keywords. The base's step is
the one migrated; the override keeps its own work around the call. With ``--exact`` the
migrated program prints the original's numbers; the default form runs as many steps.
"""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script
from trainer_text import TRAINER_CLASS

PROGRAM = (
    TRAINER_CLASS
    + """#ALIAS#
class Scaled(Trainer):
    def train_step(self, x, y):
        loss = #CALL#
        return loss * 2

    def fit(self):
        for step in range(4):
            x = torch.randn(8, 16)
            loss = self.train_step(x, x.sum(dim=1, keepdim=True))
            print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    Scaled().fit()
"""
)

CALLS = {
    "base-by-name": ("", "Trainer.train_step(self, x, y)"),
    "base-by-alias": ("_Base = Trainer\n", "_Base.train_step(self, x, y)"),
    "super-other-arguments": ("", "super().train_step(x, y * 0.5)"),
    "super-explicit-keywords": ("", "super(Scaled, self).train_step(x=x, y=y)"),
}


def _program(shape: str) -> str:
    alias, call = CALLS[shape]
    return PROGRAM.replace("#ALIAS#\n", alias).replace("#CALL#", call)


@pytest.mark.parametrize("shape", sorted(CALLS))
def test_an_override_running_the_base_step_migrates_with_the_same_numbers(shape, tmp_path):
    source = _program(shape)
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert "model.step(" in exact.migrated
    original = run_script(source, tmp_path, "original.py")
    assert original.count("step ") == 4
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, "train.py")
    assert default.status == "migrated", [d.format() for d in default.diagnostics]
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == 4
