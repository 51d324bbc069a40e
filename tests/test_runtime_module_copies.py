"""A deep copy of the module RoundPipe wraps (the EMA or averaged copy trainers build from
``model.model``) is a plain module: loading weights into it leaves the RoundPipe model and
its optimizer copies alone, while a load into the wrapped module still refreshes them."""

import copy
import gc
import io

import torch

import roundpipe


def _trained_once() -> roundpipe.RoundPipe:
    torch.manual_seed(0)
    model = roundpipe.RoundPipe(torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.5)
    model.forward_backward(input_args=(torch.ones(4, 3),), loss_fn=lambda out, _: out.sum())
    model.step(optimizer.step, is_async=False)
    return model


def _wrappers_alive() -> int:
    gc.collect()
    return sum(isinstance(o, roundpipe.RoundPipe) for o in gc.get_objects())


def test_a_deep_copy_of_the_wrapped_module_does_not_drag_the_wrapper_along():
    model = _trained_once()
    alive = _wrappers_alive()
    ema = copy.deepcopy(model.model)
    averaged = torch.optim.swa_utils.AveragedModel(model.model)
    assert _wrappers_alive() == alive  # no second RoundPipe (with its optimizer copies) in the copies
    for copied in (ema, averaged.module):
        assert type(copied) is torch.nn.Linear
        assert torch.equal(copied.weight, model.model.weight)


def test_loading_into_the_copy_leaves_the_optimizer_copies_alone():
    model = _trained_once()
    before = [p.detach().clone() for p in model.optim_parameters()]
    ema = copy.deepcopy(model.model)
    ema.load_state_dict({"weight": torch.zeros(2, 3), "bias": torch.zeros(2)})
    assert all(torch.equal(p, b) for p, b in zip(model.optim_parameters(), before))
    assert not torch.equal(model.model.weight, ema.weight)


def test_loading_into_the_wrapped_module_still_refreshes_the_optimizer_copies():
    model = _trained_once()
    copy.deepcopy(model.model)  # copying it must not disarm the original's hook
    model.model.load_state_dict({"weight": torch.full((2, 3), 0.25), "bias": torch.zeros(2)})
    weight = next(model.optim_parameters())
    assert torch.equal(weight, torch.full((2, 3), 0.25))


def test_the_wrapped_module_saved_whole_loads_as_a_plain_module():
    """``torch.save(model.model, path)`` (what a migrated ``torch.save(model, path)`` writes)
    pickles the module with the runtime's hooks on its parameters: they load as hooks that
    do nothing, so the loaded module trains as a plain one."""
    model = _trained_once()
    buffer = io.BytesIO()
    torch.save(model.model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is torch.nn.Linear
    assert torch.equal(loaded.weight, model.model.weight)
    alive = _wrappers_alive()
    loaded(torch.ones(2, 3)).sum().backward()
    assert torch.equal(loaded.weight.grad, torch.full((2, 3), 2.0))
    assert _wrappers_alive() == alive
