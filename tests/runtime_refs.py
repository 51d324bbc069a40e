"""Reference training loops for the runtime tests, written without roundpipe's runtime."""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn.functional as F


def make_net(dtype=torch.float32, seed=0, device="cpu") -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    return net.to(device=device, dtype=dtype)


def make_data(steps: int, batch: int = 10, seed: int = 1, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 6, generator=gen).to(device), torch.randn(batch, 3, generator=gen).to(device))
        for _ in range(steps)
    ]


class BatchList(torch.utils.data.Dataset):
    """Ready-made batches as a map-style dataset (use with ``batch_size=None``)."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int):
        return self.batches[index]


def loss_of(out: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), label.float())


def plain_loop(net, make_opt, data) -> Tuple[List[float], List[torch.Tensor]]:
    """The torch loop a user starts from: optimizer on the model's own parameters."""
    opt = make_opt(net.parameters())
    losses = []
    for x, y in data:
        loss = loss_of(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in net.parameters()]


def master_weight_loop(net, make_opt, data, staleness: int = 0, input_dtype=None):
    """Low-precision model + fp32 master copies, stepping with ``staleness`` 0 or 1.

    With staleness 1 the forward of iteration k (0-based) uses the weights after k-1 steps
    (the initial weights for k = 0, 1): the snapshot ``history[max(0, k - 1)]``. Returns
    the losses, the weights each forward used, and the final master values.
    """
    masters = [torch.nn.Parameter(p.detach().float().clone()) for p in net.parameters()]
    opt = make_opt(masters)
    history = [[m.detach().clone() for m in masters]]
    losses, used = [], []
    for k, (x, y) in enumerate(data):
        weights = history[max(0, k - staleness)]
        with torch.no_grad():
            for p, w in zip(net.parameters(), weights):
                p.copy_(w)
        used.append([p.detach().clone() for p in net.parameters()])
        inp = x if input_dtype is None else x.to(input_dtype)
        loss = loss_of(net(inp), y)
        loss.backward()
        for p, m in zip(net.parameters(), masters):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        opt.zero_grad()
        history.append([m.detach().clone() for m in masters])
        losses.append(loss.item())
    return losses, used, history[-1]
