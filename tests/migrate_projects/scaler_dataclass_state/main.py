"""Shape: the scaler held in a dataclass state object (issue 10, shape 3).

A ``TrainState`` dataclass carries model, optimizer, scheduler, scaler and the step count;
``create_train_state`` builds it, ``train_step(state, batch)`` reaches everything through
``state.``, and the state is checkpointed with ``dataclasses``-style field access. Hard: the
scaler is an attribute of a value passed between functions, not a name in any scope.
"""

import copy
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class TrainState:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    step: int = 0


def create_train_state(lr=0.01):
    model = nn.Sequential(nn.Linear(7, 14), nn.ELU(), nn.Linear(14, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, amsgrad=True)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=3)
    return TrainState(model, optimizer, scheduler, scaler)


def train_step(state: TrainState, batch):
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(state.model(x), y)
    state.optimizer.zero_grad()
    state.scaler.scale(loss).backward()
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.scheduler.step()
    state.step += 1
    return loss


def checkpoint(state: TrainState):
    return {
        "model": copy.deepcopy(state.model.state_dict()),
        "optimizer": copy.deepcopy(state.optimizer.state_dict()),
        "scaler": state.scaler.state_dict(),
        "step": state.step,
    }


def main():
    torch.manual_seed(0)
    state = create_train_state()
    gen = torch.Generator().manual_seed(10)
    for _ in range(8):
        batch = (torch.randn(10, 7, generator=gen), torch.randint(0, 3, (10,), generator=gen))
        loss = train_step(state, batch)
        print(f"step {state.step} loss {loss.item()!r}")
    print(f"final scale {checkpoint(state)['scaler']['scale']!r}")


if __name__ == "__main__":
    main()
