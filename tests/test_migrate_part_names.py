"""Top-level names two joined files bind each for itself (migrate.part_names)."""

from migrate.joined_classes import join_blocker, migrate_joined

_LOOP = """import logging

import torch

logger = logging.getLogger("loop")


class Trainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler("cuda")

    def step(self, x):
        logger.info("step")
        self.scaler.scale(self.model(x).mean()).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()


def main():
    logger.info("nothing to run")
"""

_SCRIPT = """import logging

import torch

from loop import Trainer

logger = logging.getLogger("script")


def main(batches):
    model = torch.nn.Linear(8, 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for x in batches:
        trainer.step(x)
    logger.info("done")
"""


def test_names_bound_in_both_files_are_kept_apart_and_come_back():
    parts = [("loop.py", _LOOP), ("script.py", _SCRIPT)]
    joined = migrate_joined(parts, exact=True, joins={("script.py", "Trainer")})
    assert joined is not None
    assert not [d for r in joined.values() for d in r.diagnostics]
    loop, script = joined["loop.py"].migrated, joined["script.py"].migrated
    assert "__rpm" not in loop + script
    assert 'logger = logging.getLogger("loop")\n' in loop and '    logger.info("step")\n' in loop
    assert "def main():\n" in loop and "def main(batches):\n" in script
    assert "torch.optim.SGD(model.optim_parameters(), lr=0.1)" in script
    assert "self.model.step(_step_fn, is_async=False)" in loop


def test_a_clash_that_cannot_be_kept_apart_is_named():
    script = _SCRIPT.replace("import torch\n", "import torch\nfrom torch import nn\n", 1)
    loop = _LOOP.replace("import torch\n", "import torch\nimport torch.nn as nn\n", 1)
    parts = [("loop.py", loop), ("script.py", script)]
    assert migrate_joined(parts, exact=True, joins={("script.py", "Trainer")}) is None
    blocker = join_blocker(parts, {("script.py", "Trainer")})
    assert blocker == (
        "loop.py:4 binds the top-level name `nn` that another file binds too "
        "(by an import line that differs from the other file's)"
    )
