"""The report says which target form each training step got, and why (design/MIGRATE.md,
"Two target forms")."""

from migrate.engine import migrate_source
from migrate.rules import autograd_form, step_function

FUSED = step_function.RULE.examples[0].before
UNFUSED = autograd_form.RULE.examples[0].before  # work between the forward and the backward


def _descriptions(source):
    result = migrate_source(source, "train.py", exact=True)
    assert result.status == "migrated"
    return [rewrite.description for rewrite in result.rewrites]


def test_a_fusable_step_is_reported_in_the_fused_form():
    found = _descriptions(FUSED)
    assert "forward + loss -> model.forward_backward(loss_fn=...)" in found
    assert not any(d.startswith("autograd form") for d in found)


def test_an_unfusable_step_is_reported_in_the_autograd_form_with_the_reason():
    found = [d for d in _descriptions(UNFUSED) if d.startswith("autograd form")]
    assert len(found) == 1
    assert "not fused: " in found[0] and "forward" in found[0].split("not fused: ")[1]
    assert not any("forward_backward" in d for d in _descriptions(UNFUSED))
