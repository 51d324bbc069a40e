"""A gradient the step function leaves on an optimizer copy (no zeroing in the step
function, or ``zero_grad(set_to_none=False)``) stays the copy's own: the model's
``param.grad`` is free for the next backward, and a ``zero_grad()`` of the optimizer on the
main thread drops only what the copies hold. The codemod relies on this: it keeps a
``zero_grad()`` written between the forward and the backward after ``forward_backward``, where
it drops the copies' gradients before the next hand-over.
"""

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


def _clip_step(opt: torch.optim.Optimizer):
    def step() -> None:
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 0.3)
        opt.step()

    return step


def test_a_zero_grad_after_forward_backward_drops_only_the_copies_kept_gradients():
    # Plain order: forward, zero_grad, backward, clip in place, step (no zeroing after it).
    # Migrated order: forward_backward, then the same zero_grad on the main thread, then a
    # synchronous step clipping the copies in place. The clipped gradient the step leaves on
    # a copy must not reach the model's next backward.
    data = make_data(6)
    ref = _SometimesHead()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    net = _SometimesHead()
    model = RoundPipe(net)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.5, momentum=0.9)
    for k, (x, y) in enumerate(data):
        ref.use_c = net.use_c = k % 3 == 1
        out = ref(x)
        ref_opt.zero_grad()
        loss_of(out, y).backward()
        _clip_step(ref_opt)()
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        opt.zero_grad()
        model.step(_clip_step(opt), is_async=False)
    assert all(torch.equal(p, r) for p, r in zip(net.parameters(), ref.parameters()))


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
