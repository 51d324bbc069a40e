"""Shape: work between the forward and the backward (issue 10, shape 7), migrated by hand:
the --exact target.

Autograd form: the forward, the loss sum, the ``.item()`` reads, the finite check, the log
and the warm-up rescale stay on the main thread exactly as written; the backward stays
``scaler.scale(losses).backward()``; the step and the ``zero_grad`` before the next backward
move into the step function.

Original docstring:

Detection-style: the model returns a dict of losses in training mode; the loop sums them,
reads ``.item()`` of each for the log, raises on a non-finite total, rescales the loss
under an ``if`` (warm-up), and only then calls ``scaler.scale(losses).backward()``. Hard:
none of this may move into a loss function running elsewhere; the main thread has to see
the values in the original order, so this is the autograd form's case.
"""

import logging
import math

import roundpipe
import torch
import torch.nn as nn
import torch.nn.functional as F

logger = logging.getLogger("train")


class TinyDetector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.cls_head = nn.Linear(32, 3)
        self.box_head = nn.Linear(32, 4)

    def forward(self, images, targets=None):
        features = self.backbone(images)
        logits, boxes = self.cls_head(features), self.box_head(features)
        if not self.training:
            return logits, boxes
        return {
            "loss_cls": F.cross_entropy(logits.float(), targets["labels"]),
            "loss_box": F.smooth_l1_loss(boxes.float(), targets["boxes"], beta=0.1),
        }


class LossNotFinite(FloatingPointError):
    pass


def run_step(model, optimizer, scaler, batch, iteration, warmup_iters=3):
    images, targets = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_dict = model(images, targets)
    losses = sum(loss_dict.values())
    metrics = {k: v.detach().item() for k, v in loss_dict.items()}
    total = losses.item()
    if not math.isfinite(total):
        raise LossNotFinite(f"Loss became infinite or NaN at iteration={iteration}! loss_dict={metrics}")
    logger.info("iter %d %s", iteration, metrics)
    if iteration < warmup_iters:
        losses = losses * (iteration + 1) / warmup_iters
    scaler.scale(losses).backward()

    def step_fn():
        scaler.step(optimizer)
        optimizer.zero_grad()

    model.step(step_fn, is_async=False)
    scaler.update()
    return total, metrics


def main():
    torch.manual_seed(0)
    model = roundpipe.RoundPipe(TinyDetector())
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
    scaler = roundpipe.GradScaler()
    gen = torch.Generator().manual_seed(2)
    model.train()
    for iteration in range(8):
        batch = (
            torch.randn(16, 10, generator=gen),
            {"labels": torch.randint(0, 3, (16,), generator=gen), "boxes": torch.rand(16, 4, generator=gen)},
        )
        total, metrics = run_step(model, optimizer, scaler, batch, iteration)
        print(f"step {iteration} loss {total!r} loss_box {metrics['loss_box']!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
