"""Checkpoint helpers of another file that only save or load state (issue 10, shape 13), and
objects returned by a setup function (shape 3): migrate.state_helpers, migrate.returned and
the project layer that connects them."""

import ast
import textwrap

from migrate.engine import migrate_source
from migrate.project import migrate_project
from migrate.state_helpers import find_state_helpers

HELPERS = textwrap.dedent(
    """\
    import torch


    def save_checkpoint(path, model, optimizer, scaler=None):
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if scaler is not None and not path.endswith(".tmp"):
            state["scaler"] = scaler.state_dict()
        torch.save(state, path)


    def evaluate(model, batches):
        model.eval()
        return [model(x) for x, _ in batches]
    """
)

TRAIN = textwrap.dedent(
    """\
    import torch

    import helpers


    def main(batches):
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        for x, y in batches:
            with torch.autocast("cuda"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        helpers.save_checkpoint("last.pt", model, optimizer, scaler=scaler)
    """
)


def test_state_only_parameters_are_those_used_only_for_state_dicts_and_presence_tests():
    found = find_state_helpers(ast.parse(HELPERS))
    assert set(found) == {"save_checkpoint"}  # evaluate() calls and evaluates its model
    assert found["save_checkpoint"].params == ("path", "model", "optimizer", "scaler")
    assert found["save_checkpoint"].state_only == {"model", "optimizer", "scaler"}


def test_a_parameter_that_is_stored_passed_on_or_rebound_is_not_state_only():
    source = textwrap.dedent(
        """\
        def keep(holder, scaler):
            holder.scaler = scaler

        def forward(scaler):
            save(scaler.state_dict(), scaler)

        def rebound(scaler):
            scaler = None
            return scaler.state_dict()

        def chosen(scaler):
            return scaler if scaler else None
        """
    )
    assert find_state_helpers(ast.parse(source)) == {}


def test_the_wrapped_model_reaches_a_checkpoint_helper_of_another_file_as_its_module():
    results = migrate_project({"helpers.py": HELPERS, "train.py": TRAIN})
    train, helpers = results["train.py"], results["helpers.py"]
    assert train.status == "migrated", [d.format() for d in train.diagnostics]
    assert (
        '    model.synchronize()\n    helpers.save_checkpoint("last.pt", model.model, optimizer, scaler=scaler)\n'
        in train.migrated
    )
    assert not helpers.changed and helpers.diagnostics == []
    again = migrate_project({"helpers.py": HELPERS, "train.py": train.migrated})
    assert not again["train.py"].changed and again["train.py"].diagnostics == []


def test_a_helper_that_does_more_than_checkpointing_still_refuses_the_caller():
    train = TRAIN.replace(
        'helpers.save_checkpoint("last.pt", model, optimizer, scaler=scaler)', "helpers.evaluate(model, batches)"
    )
    result = migrate_project({"helpers.py": HELPERS, "train.py": train})["train.py"]
    assert not result.changed
    assert [d.code for d in result.diagnostics] == ["RPM110"]


def test_alone_the_file_refuses_the_scaler_handed_to_an_unknown_function():
    result = migrate_source(TRAIN, "train.py")
    assert not result.changed
    assert [d.code for d in result.diagnostics] == ["RPM104"]


def test_a_scaler_returned_by_a_setup_function_nobody_here_calls_is_refused():
    source = textwrap.dedent(
        """\
        import torch


        def setup_amp(cfg):
            scaler = torch.amp.GradScaler("cuda", init_scale=cfg["init_scale"])
            return cfg, scaler
        """
    )
    result = migrate_source(source, "amp_setup.py")
    assert not result.changed
    assert [(d.line, d.code) for d in result.diagnostics] == [(6, "RPM105")]
