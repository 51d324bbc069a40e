"""RoundPipe.adopt_optimizer: an optimizer built by a parameter-group helper on the wrapped
module's own parameters moves onto the optimizer copies by identity (issue 10, shape 8)."""

import pytest
import torch
from torch import nn

from roundpipe import RoundPipe


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))


def _groups(module):
    decay = [p for n, p in module.named_parameters() if p.requires_grad and not n.endswith("bias")]
    no_decay = [p for n, p in module.named_parameters() if p.requires_grad and n.endswith("bias")]
    return [{"params": no_decay, "weight_decay": 0.0, "lr_scale": 0.5}, {"params": decay, "weight_decay": 0.1}]


def test_groups_move_onto_the_copies_keeping_options_and_order():
    model = RoundPipe(_model())
    module = model.model
    optimizer = torch.optim.AdamW(_groups(module), lr=0.1)
    originals = [list(g["params"]) for g in optimizer.param_groups]
    assert model.adopt_optimizer(optimizer) is optimizer
    copies = dict(zip(module.parameters(), model.optim_parameters()))
    for group, before in zip(optimizer.param_groups, originals):
        assert [id(p) for p in group["params"]] == [id(copies[p]) for p in before]
    assert optimizer.param_groups[0]["lr_scale"] == 0.5 and optimizer.param_groups[1]["weight_decay"] == 0.1
    model.adopt_optimizer(optimizer)  # twice: nothing changes
    assert [id(p) for p in optimizer.param_groups[1]["params"]] == [id(copies[p]) for p in originals[1]]


def test_training_through_the_adopted_optimizer_matches_plain_torch():
    reference = _model()
    reference_opt = torch.optim.AdamW(_groups(reference), lr=0.1)
    model = RoundPipe(_model())
    optimizer = model.adopt_optimizer(torch.optim.AdamW(_groups(model.model), lr=0.1))
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    for _ in range(3):
        nn.functional.mse_loss(reference(x), y).backward()
        reference_opt.step()
        reference_opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()

        def step_fn():
            optimizer.step()
            optimizer.zero_grad()

        model.step(step_fn, is_async=False)
    for got, expected in zip(model.model.parameters(), reference.parameters()):
        assert torch.equal(got, expected)


def test_state_created_at_construction_moves_and_frozen_parameters_stay():
    module = _model()
    module[0].requires_grad_(False)
    model = RoundPipe(module)
    optimizer = torch.optim.Adagrad(module.parameters(), lr=0.1, initial_accumulator_value=0.5)
    frozen = module[0].weight
    model.adopt_optimizer(optimizer)
    params = optimizer.param_groups[0]["params"]
    assert params[0] is frozen  # no copy: it gets no gradient, as before
    copy = params[2]
    assert copy is not module[1].weight and copy in optimizer.state
    assert torch.equal(optimizer.state[copy]["sum"], torch.full_like(copy, 0.5))
    assert module[1].weight not in optimizer.state


def test_a_parameter_that_is_not_the_modules_is_refused_and_nothing_changes():
    model = RoundPipe(_model())
    stranger = nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([*model.model.parameters(), stranger], lr=0.1)
    before = list(optimizer.param_groups[0]["params"])
    with pytest.raises(ValueError, match="not one of the wrapped module's"):
        model.adopt_optimizer(optimizer)
    assert optimizer.param_groups[0]["params"] == before


def test_adopted_state_takes_the_copys_dtype_and_keeps_its_values():
    # A bf16 model with fp32 optimizer copies: state made on the model's parameters (here
    # loaded from a checkpoint before adoption) is cast as torch's load_state_dict casts it.
    module = _model().to(torch.bfloat16)
    model = RoundPipe(module, optim_dtype=torch.float32)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    saved = optimizer.state_dict()
    saved["state"] = {
        i: {"step": torch.tensor(3.0), "exp_avg": torch.full_like(p, 0.25), "exp_avg_sq": torch.full_like(p, 0.5)}
        for i, p in enumerate(module.parameters())
    }
    optimizer.load_state_dict(saved)
    model.adopt_optimizer(optimizer)
    for copy in optimizer.param_groups[0]["params"]:
        state = optimizer.state[copy]
        assert copy.dtype == torch.float32
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
        assert torch.equal(state["exp_avg"], torch.full_like(copy, 0.25))
        assert torch.equal(state["exp_avg_sq"], torch.full_like(copy, 0.5))
        assert state["step"].dtype == torch.float32 and state["step"].item() == 3.0
