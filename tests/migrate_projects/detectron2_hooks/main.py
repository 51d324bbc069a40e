"""Shape: detectron2's ``DefaultTrainer`` with hooks (held-out round 2).

``train_loop.py`` holds ``TrainerBase`` (``train`` calls ``before_step``/``run_step``/
``after_step`` and every registered hook's methods), ``SimpleTrainer`` and ``AMPTrainer``
(a GradScaler built when none is injected; ``run_step`` sums the loss dict under autocast,
zeroes, scales and backpropagates, writes the metrics (``.item()`` of every loss, a
non-finite check that raises), steps and updates; ``state_dict`` carries the scaler).
``hooks.py`` holds the hooks: ``LRScheduler`` reads the lr of the largest group and steps
the scheduler after every step, ``PeriodicWriter`` prints, ``PeriodicCheckpointer`` stores
model, optimizer, scheduler and trainer state. ``main.py`` builds the model, SGD with a
bias group, a ``MultiStepLR``, the trainer and its hooks (each given the optimizer or the
scheduler), and trains. Hard: the scheduler step and the optimizer-state reads happen in
other objects' methods, reached through a list of hooks after ``run_step``.
"""

import torch
import torch.nn as nn

from hooks import LRScheduler, PeriodicCheckpointer, PeriodicWriter
from train_loop import AMPTrainer


class TinyRCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 10), nn.ReLU())
        self.cls_head = nn.Linear(10, 3)
        self.box_head = nn.Linear(10, 4)

    def forward(self, data):
        x, labels, boxes = data
        features = self.backbone(x)
        return {
            "loss_cls": nn.functional.cross_entropy(self.cls_head(features).float(), labels),
            "loss_box_reg": nn.functional.smooth_l1_loss(self.box_head(features).float(), boxes),
        }


def build_loader(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen), torch.rand(8, 4, generator=gen))
        for _ in range(n)
    ]


def build_optimizer(model, base_lr):
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    weights = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    return torch.optim.SGD(
        [{"params": weights}, {"params": biases, "lr": base_lr * 2, "weight_decay": 0.0}],
        lr=base_lr,
        momentum=0.9,
        weight_decay=1e-4,
    )


def main():
    torch.manual_seed(0)
    model = TinyRCNN()
    optimizer = build_optimizer(model, 0.02)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[3, 6], gamma=0.1)
    trainer = AMPTrainer(model, build_loader(8, seed=2), optimizer)
    store = {}
    trainer.register_hooks(
        [
            LRScheduler(optimizer, scheduler),
            PeriodicWriter(1),
            PeriodicCheckpointer(store, model, optimizer, scheduler, period=4),
        ]
    )
    trainer.train(0, 8)
    print(f"final scale {store['trainer']['grad_scaler']['scale']!r} iteration {store['trainer']['iteration']!r}")


if __name__ == "__main__":
    main()
