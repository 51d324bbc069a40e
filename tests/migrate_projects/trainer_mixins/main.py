"""Shape: a trainer whose iteration is split over mixins (issue 10, shape 1).

``hooks.py`` holds three mixins (forward, backward, update) that each reach the objects
through ``self``; ``main.py`` composes them into ``AMPTrainer`` with the scaler named
``grad_scaler`` and a ``run_step`` that calls them in order, plus a ``state_dict`` with the
scaler. Hard: the training step exists only as the sequence of calls across classes and
files.
"""

import torch
import torch.nn as nn

from hooks import BackwardMixin, ForwardMixin, UpdateMixin


class AMPTrainer(ForwardMixin, BackwardMixin, UpdateMixin):
    def __init__(self, model, optimizer, amp=True, clip=0.25):
        self.model = model
        self.optimizer = optimizer
        self.amp = amp
        self.clip = clip
        self.grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2, enabled=amp)
        self.iter = 0

    def run_step(self, batch):
        loss_dict = self.forward_losses(batch)
        losses = sum(loss_dict.values())
        self.backward(losses)
        norm = self.update_params()
        self.iter += 1
        return losses.detach(), norm

    def state_dict(self):
        return {"iteration": self.iter, "grad_scaler": self.grad_scaler.state_dict()}


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Dropout(0.1), nn.Linear(20, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = AMPTrainer(model, optimizer)
    gen = torch.Generator().manual_seed(9)
    for _ in range(8):
        batch = (torch.randn(16, 10, generator=gen), torch.randint(0, 3, (16,), generator=gen))
        loss, norm = trainer.run_step(batch)
        print(f"step {trainer.iter} loss {loss.item()!r} norm {norm.item()!r}")
    print(f"final scale {trainer.state_dict()['grad_scaler']['scale']!r}")


if __name__ == "__main__":
    main()
