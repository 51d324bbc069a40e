"""Shape: a trainer base class bound through ``super().__init__`` (issue 10, shape 1).

``train_loop.py`` holds detectron2's layout: ``SimpleTrainer.__init__(self, model,
data_loader, optimizer)`` stores what it is handed and trains without AMP;
``AMPTrainer(SimpleTrainer)`` builds the GradScaler in its own ``__init__``, hands the rest on
with ``super(AMPTrainer, self).__init__(model, data_loader=..., optimizer=...)`` and overrides
``run_step`` with the AMP step (loss dict summed, ``scale(losses).backward()``, step, update).
Hard: the model and optimizer reach ``self`` only through the base's ``__init__``, in another
file, and the base's plain step is one the program never runs.
"""

import torch
import torch.nn as nn

from train_loop import AMPTrainer


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 2))

    def forward(self, x, y):
        out = self.body(x).float()
        return {"loss_mse": nn.functional.mse_loss(out, y), "loss_l1": 0.1 * (out - y).abs().mean()}


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)) for _ in range(6)]
    trainer = AMPTrainer(model, data, optimizer)
    trainer.train(6)
    print(f"checkpoint {trainer.state_dict()['grad_scaler']['scale']!r}")
    print(f"final scale {trainer.grad_scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
