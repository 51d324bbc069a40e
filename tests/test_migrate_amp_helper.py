"""AMP helper classes with separate methods (migrate.amp_helper_class): which classes are
helpers, how their method roles reach the files that call them, and what stays refused.
The programs' numbers are checked by the projects amp_helper_* (tests/migrate_projects)."""

import ast

import pytest

from migrate.amp_helper_class import amp_helper_roles
from migrate.engine import migrate_source
from migrate.project import migrate_project, project_view, wrapper_contexts
from migrate.rules.amp_helper_class import _HELPER

HELPER = _HELPER[: _HELPER.index("\n\ndef train")] + "\n"

LOOP = """import torch


def train_one_epoch(model, loader, optimizer, amp, max_norm):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        amp.scale_loss(loss).backward()
        amp.unscale(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        amp.optimizer_step(optimizer)
"""

MAIN = """import torch

from amp import AMPScaler
from engine import train_one_epoch


def main(model, loader):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = AMPScaler(scaler=torch.cuda.amp.GradScaler(init_scale=1024.0))
    train_one_epoch(model, loader, optimizer, amp, 1.0)
"""


def _class(source: str) -> ast.ClassDef:
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef))


def test_roles_of_a_helper_as_its_callers_see_them():
    assert amp_helper_roles(_class(HELPER)) == {
        "__init__": "scaler scaler 1",  # `self.scaler = scaler or GradScaler(...)`: handed in second
        "scale_loss": "scale",
        "unscale": "unscale",
        "optimizer_step": "step",
    }


def test_a_trainer_stepping_an_optimizer_it_is_handed_with_the_batch_is_no_helper():
    trainer = """class Trainer:
    def __init__(self, model):
        self.model = model
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, batch, optimizer):
        self.scaler.scale(self.model(batch).sum()).backward()
        self.scaler.step(optimizer)
        self.scaler.update()
"""
    assert amp_helper_roles(_class(trainer)) is None
    assert (
        amp_helper_roles(
            _class(trainer.replace("def train_step(self, batch, optimizer)", "def __call__(self, optimizer)"))
        )
        is None
    )


def test_roles_travel_to_the_loop_that_only_receives_the_helper():
    files = project_view({"amp.py": HELPER, "engine.py": LOOP, "main.py": MAIN})
    contexts = wrapper_contexts(files)
    assert ("train_one_epoch", "amp", "optimizer_step", "step") in contexts["engine.py"].helper_params
    assert ("AMPScaler", "unscale", "unscale") in contexts["main.py"].helper_roles
    results = migrate_project({"amp.py": HELPER, "engine.py": LOOP, "main.py": MAIN}, exact=True)
    assert {p: r.status for p, r in results.items()} == dict.fromkeys(results, "migrated")
    assert "clip_grad_norm_(model.optim_parameters(), max_norm)" in results["engine.py"].migrated
    assert "AMPScaler(scaler=roundpipe.GradScaler(" in results["main.py"].migrated
    assert "model=model)" in results["main.py"].migrated


def test_without_the_class_file_the_loop_is_left_alone():
    results = migrate_project({"engine.py": LOOP, "main.py": MAIN}, exact=True)
    assert not any(r.changed for r in results.values())


def test_the_helpers_file_alone_is_refused_naming_the_missing_builder():
    result = migrate_source(HELPER, "amp.py")
    assert result.migrated == HELPER
    assert [d.code for d in result.diagnostics] == ["RPM111"]
    assert "not among the given files" in result.diagnostics[0].message


def test_an_unscale_without_a_step_after_it_is_refused():
    source = _HELPER.replace("        amp.optimizer_step(optimizer)\n", "")
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    assert [(d.code, d.line) for d in result.diagnostics] == [
        ("RPM111", source[: source.index("amp.unscale(")].count("\n") + 1)
    ]


def test_a_scaler_built_elsewhere_and_handed_to_the_helper_is_refused():
    source = _HELPER.replace("    amp = AMPScaler()\n", "    amp = AMPScaler(True, make_scaler())\n")
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM111"]
    assert "`make_scaler()` as its scaler" in result.diagnostics[0].message


CLIPPING = "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
SAVE = '    torch.save({"model": model.state_dict()'


@pytest.mark.parametrize(
    "old, new",
    [
        (CLIPPING, CLIPPING.replace("torch.nn", "norm = torch.nn")),
        (SAVE, "    count = sum(p.numel() for p in model.parameters())\n" + SAVE),
    ],
    ids=["clipping-norm", "parameter-count"],
)
def test_a_helper_built_after_the_loop_wraps_the_model_once_where_the_optimizer_is_built(old, new):
    """A second helper built after the loop (to resume from the checkpoint) takes the model
    whose optimizer is built before it, never a later assignment of a number read off the
    model's parameters (a clipping's norm, a count)."""
    source = _HELPER.replace(old, new).replace('"ckpt.pth")\n', '"ckpt.pth")\n    resumed = AMPScaler()\n')
    assert new in source
    result = migrate_source(source, "train.py", exact=True)
    assert not result.diagnostics
    assert result.migrated.count("roundpipe.RoundPipe(") == 1
    wrap = result.migrated.index("model = roundpipe.RoundPipe(model")
    assert wrap < result.migrated.index("optimizer = torch.optim.AdamW(model.optim_parameters()")
    assert "clip_grad_norm_(model.optim_parameters(), max_norm)" in result.migrated
    assert "resumed = AMPScaler(model=model)" in result.migrated


def test_a_helper_built_after_another_read_of_the_wrapped_models_parameters_is_refused():
    """``stats = describe(model.parameters())`` after the wrap may be an optimizer or not:
    the helper built after it is refused rather than wrapping the model a second time."""
    source = _HELPER.replace(SAVE, "    stats = describe(model.parameters())\n" + SAVE).replace(
        '"ckpt.pth")\n', '"ckpt.pth")\n    resumed = AMPScaler()\n'
    )
    result = migrate_source(source, "train.py", exact=True)
    assert result.migrated == source
    assert [(d.code, d.line) for d in result.diagnostics] == [
        ("RPM111", source[: source.index("    stats = ")].count("\n") + 1)
    ]
    assert "already wrapped" in result.diagnostics[0].message
