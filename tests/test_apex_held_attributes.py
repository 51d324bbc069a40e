"""apex ``amp.initialize`` results held on ``self`` (issue 10, shape 12): initialize of
locals that are dropped afterwards migrates; each use that is not followed is refused at its
line, naming what it does (an alias in the step, a hand-off to another object, a forward
outside the step, a local still used after initialize)."""

from __future__ import annotations

from typing import List, Tuple

import pytest

from migrate.engine import migrate_source

TRAINER = """import torch
from apex import amp


class Trainer:
    def __init__(self):
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")
        self.keep = None

    def train_step(self, x):
        out = self.model(x)
        loss = out.sum()
        self.optimizer.zero_grad()
        with amp.scale_loss(loss, self.optimizer) as scaled:
            scaled.backward()
        self.optimizer.step()
        return loss.item()
"""


def _variant(old: str, new: str) -> str:
    assert old in TRAINER
    return TRAINER.replace(old, new)


def _refused(source: str) -> List[Tuple[int, str, str]]:
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    return [(d.line, d.code, d.message) for d in result.diagnostics]


def _line(source: str, text: str) -> int:
    return source[: source.index(text)].count("\n") + 1


def test_initialize_of_locals_dropped_after_it_migrates() -> None:
    result = migrate_source(TRAINER, "train.py")
    assert not result.diagnostics
    assert "roundpipe.compat.initialize(model, optimizer" in result.migrated
    assert "self.model.step(_step_fn" in result.migrated


def test_a_local_used_after_initialize_is_refused() -> None:
    source = _variant("        self.keep = None\n", "        self.keep = model\n")
    [(line, code, message)] = _refused(source)
    assert (line, code) == (_line(source, "self.model, self.optimizer ="), "RPM201")
    assert "locals all unused after it" in message


def test_the_steps_alias_of_the_held_model_is_refused_at_the_alias() -> None:
    source = _variant("        out = self.model(x)\n", "        model = self.model\n        out = model(x)\n")
    [(line, code, message)] = _refused(source)
    assert (line, code) == (_line(source, "model = self.model"), "RPM201")
    assert "local alias" in message and "not called exactly once" not in message


@pytest.mark.parametrize(
    "use, what",
    [
        ("        self.keep = Copy(self.model)\n", "passed to `Copy(...)`"),
        ("        self.keep = self.model(torch.ones(1, 4))\n", "called (a forward pass)"),
        ("        self.keep = self.model\n", "bound to another name"),
    ],
)
def test_a_held_model_used_outside_the_step_is_refused_naming_the_use(use: str, what: str) -> None:
    source = _variant("        self.keep = None\n", use)
    [(line, code, message)] = _refused(source)
    assert (line, code) == (_line(source, use.strip()), "RPM201")
    assert what in message
