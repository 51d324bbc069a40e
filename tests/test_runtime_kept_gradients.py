"""A gradient the step function leaves on an optimizer copy (``zero_grad(set_to_none=False)``,
or no zeroing): after a synchronous step the model and the plain loop agree on it.

In the plain loop such a gradient stays in ``param.grad``; what the user does to it before
the next step (``model.zero_grad()``, ``optimizer.zero_grad()`` on the main thread, an
in-place zero) decides whether the optimizer moves a parameter the next backward gives no
gradient (momentum, Adam's moments, weight decay). After a synchronous step the model
parameter and its copy hold that one tensor, so each of these acts as in the plain loop.
"""

from typing import Callable, List, Optional

import pytest
import torch

from roundpipe import RoundPipe
from runtime_refs import loss_of, make_data

OPTIMIZERS = {  # momentum and weight decay, and Adam's moments, move a zero-gradient parameter
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}


class _SometimesHead(torch.nn.Module):
    """A trunk and a head, plus a second head used in iterations 1 and 4 only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)
        self.use_c = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return self.b(h) + self.c(h) if self.use_c else self.b(h)


# What the user does between two steps, on the main thread, in both loops: ``model`` is the
# module the user trains (the plain module, or the RoundPipe), ``opt`` its optimizer.
UserAction = Callable[[torch.nn.Module, torch.optim.Optimizer, int], None]

ACTIONS: dict = {
    "nothing": lambda model, opt, k: None,
    "model_zero_grad_set_to_none": lambda model, opt, k: model.zero_grad(set_to_none=True),
    "model_zero_grad_in_place": lambda model, opt, k: model.zero_grad(set_to_none=False),
    "optimizer_zero_grad_on_the_main_thread": lambda model, opt, k: opt.zero_grad() if k % 2 else None,
    "grad_dropped_on_one_layer": lambda model, opt, k: _drop_grad(model, "c"),
}


def _drop_grad(model: torch.nn.Module, layer: str) -> None:
    inner = model.model if isinstance(model, RoundPipe) else model
    getattr(inner, layer).weight.grad = None


def _grads(net: torch.nn.Module) -> List[Optional[torch.Tensor]]:
    return [None if p.grad is None else p.grad.detach().clone() for p in net.parameters()]


def _same(a: List[Optional[torch.Tensor]], b: List[Optional[torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y)) for x, y in zip(a, b)
    )


def _plain(name: str, zero: Callable[[torch.optim.Optimizer], None], action: UserAction, data):
    net = _SometimesHead()
    opt = OPTIMIZERS[name](list(net.parameters()))
    seen = []
    for k, (x, y) in enumerate(data):
        net.use_c = k % 3 == 1
        loss_of(net(x), y).backward()
        opt.step()
        zero(opt)
        seen.append(_grads(net))
        action(net, opt, k)
    return [p.detach().clone() for p in net.parameters()], seen


def _roundpipe(name: str, zero: Callable[[torch.optim.Optimizer], None], action: UserAction, data):
    net = _SometimesHead()
    model = RoundPipe(net)
    opt = OPTIMIZERS[name](model.optim_parameters())
    seen = []
    for k, (x, y) in enumerate(data):
        net.use_c = k % 3 == 1
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), zero(opt)), is_async=False)
        seen.append(_grads(net))
        action(model, opt, k)
    model.synchronize()
    return [p.detach().clone() for p in net.parameters()], seen


def _every_other_step() -> Callable[[torch.optim.Optimizer], None]:
    """Zero in place after every second step only (gradients sum over two steps)."""
    calls = iter(range(100))
    return lambda opt: opt.zero_grad(set_to_none=False) if next(calls) % 2 else None


ZEROING = {  # a fresh zeroing schedule for each loop
    "zero_grad_set_to_none_false": lambda: lambda opt: opt.zero_grad(set_to_none=False),
    "no_zeroing_every_other_step": _every_other_step,
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
@pytest.mark.parametrize("zeroing", sorted(ZEROING))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_gradient_the_step_function_keeps_acts_as_the_plain_loops(name, zeroing, action):
    data = make_data(6)
    expected, expected_grads = _plain(name, ZEROING[zeroing](), ACTIONS[action], data)
    weights, grads = _roundpipe(name, ZEROING[zeroing](), ACTIONS[action], data)
    assert all(torch.equal(w, e) for w, e in zip(weights, expected))
    assert all(_same(g, e) for g, e in zip(grads, expected_grads))  # what param.grad reads after each step


class _Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x


def test_a_kept_gradient_joins_an_asynchronous_step_once():
    # SGD, lr 1, every gradient 1: a sync step, an async step, a sync step = three steps of
    # one gradient each, whatever the staleness (the shared tensor is not handed twice).
    module = _Scale()
    weight = module.weight
    model = RoundPipe(module)
    (copy,) = model.optim_parameters()
    opt = torch.optim.SGD([copy], lr=1.0)

    def step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=False)

    for is_async in (False, True, False):
        model.forward_backward((torch.ones(2),), loss_fn=lambda out, _: out.sum())
        model.step(step, is_async=is_async)
        if is_async:
            assert weight.grad is not copy.grad  # never shared across an asynchronous step
        else:
            assert weight.grad is copy.grad and not weight.grad.any()
    model.synchronize()
    assert copy.tolist() == [-3.0, -3.0] and weight.tolist() == [-3.0, -3.0]


def test_a_kept_gradient_of_another_dtype_stays_the_copys_own():
    net = torch.nn.Linear(3, 2).half()
    model = RoundPipe(net, optim_dtype=torch.float32)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    model.forward_backward((torch.randn(4, 3).half(),), loss_fn=lambda out, _: out.float().sum())
    model.step(lambda: (opt.step(), opt.zero_grad(set_to_none=False)), is_async=False)
    assert all(p.grad is None for p in net.parameters())
    assert all(c.grad is not None and c.grad.dtype == torch.float32 for c in model.optim_parameters())


def test_a_kept_gradient_the_optimizer_drops_is_not_added_into_by_the_next_backward():
    # timm's NativeScaler pattern: a step function that does not zero, optimizer.zero_grad()
    # on the main thread after the step, and plain `loss.backward()` calls (not
    # forward_backward) accumulating over two iterations.
    data = make_data(6)
    ref = _SometimesHead()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    net = _SometimesHead()
    model = RoundPipe(net)
    opt = torch.optim.AdamW(model.optim_parameters(), lr=0.01, weight_decay=0.1)
    for k, (x, y) in enumerate(data):
        loss_of(ref(x), y).backward()
        loss_of(model(x), y).backward()
        if k % 2:
            ref_opt.step()
            ref_opt.zero_grad()
            model.step(opt.step, is_async=False)
            opt.zero_grad()
    assert all(torch.equal(p, r) for p, r in zip(net.parameters(), ref.parameters()))
