"""The optimizer copies are memory of their own, also with ``optim_dtype=None`` and in
synchronous steps (upstream RoundPipe's contract; docs/runtime.md, "Threads and staleness").

These are the guarantees that letting a copy share the model parameter's storage in
synchronous steps (to skip the copy into the model) would break; docs/performance.md says
why the copy is kept.
"""

import pytest
import torch

from roundpipe import RoundPipe
from runtime_refs import loss_of, make_data, make_net


def _train(model, opt, data, modes):
    for (x, y), is_async in zip(data, modes):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)


def _storages(tensors):
    return {t.untyped_storage().data_ptr() for t in tensors}


@pytest.mark.parametrize("is_async", [False, True])
def test_a_write_into_the_model_weights_does_not_reach_the_optimizer(is_async):
    # RPM141's premise: the next step writes the copies back over the write.
    net = make_net()
    model = RoundPipe(net)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    data = make_data(3)
    _train(model, opt, data[:1], [is_async])
    model.synchronize()
    before = [c.detach().clone() for c in model.optim_parameters()]
    with torch.no_grad():
        net[0].weight.fill_(7.0)
    assert all(torch.equal(c, b) for c, b in zip(model.optim_parameters(), before))
    _train(model, opt, data[1:], [is_async, is_async])
    model.synchronize()
    assert not (net[0].weight == 7.0).any()
    assert all(torch.equal(p, c) for p, c in zip(net.parameters(), model.optim_parameters()))


def test_inside_a_synchronous_step_function_the_model_holds_the_weights_before_the_step():
    net = make_net()
    model = RoundPipe(net)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    x, y = make_data(1)[0]
    before = [p.detach().clone() for p in net.parameters()]
    seen = []

    def step_fn():
        opt.step()
        seen.extend(p.detach().clone() for p in net.parameters())  # the model's own weights

    model.forward_backward((x,), label=y, loss_fn=loss_of)
    model.step(step_fn, is_async=False)
    assert all(torch.equal(s, b) for s, b in zip(seen, before))
    assert not torch.equal(net[0].weight, before[0])  # copied into the model afterwards


def test_the_copies_never_share_memory_with_the_model():
    net = make_net()
    model = RoundPipe(net)  # optim_dtype=None: same dtype, still a copy
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    copies = list(model.optim_parameters())
    data = make_data(5)
    for modes in ([False, False], [True], [False]):
        _train(model, opt, data[: len(modes)], modes)
        model.synchronize()
        assert not _storages(copies) & _storages(net.parameters())
    net.load_state_dict({k: v.clone() for k, v in net.state_dict().items()}, assign=True)
    _train(model, opt, data[:1], [False])
    assert not _storages(copies) & _storages(net.parameters())


def test_views_of_the_copies_stay_views_across_step_modes():
    # An EMA or a flat-buffer helper may hold views of the optimizer copies: the copies keep
    # their memory whatever the step mode, so the views follow every step.
    net = make_net()
    model = RoundPipe(net)
    copies = list(model.optim_parameters())
    views = [c.detach() for c in copies]
    opt = torch.optim.SGD(copies, lr=0.1)
    _train(model, opt, make_data(4), [False, True, True, False])
    model.synchronize()
    assert all(v.data_ptr() == c.data_ptr() and torch.equal(v, c) for v, c in zip(views, copies))
