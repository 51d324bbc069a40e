"""Shape: NVIDIA's Tacotron2 ``train.py`` (held-out round; apex imported under the flag).

``from apex import amp`` sits inside ``if hparams.fp16_run:`` in ``train``, where
``amp.initialize`` rebinds model and optimizer. Every iteration writes the annealed learning
rate into every group, zeroes the gradients through ``model.zero_grad()``, splits the batch
with the model's own ``parse_batch``, reads ``loss.item()`` before the backward, then takes
``with amp.scale_loss(...)`` or ``loss.backward()``; the clip runs on
``amp.master_params(optimizer)`` or on ``model.parameters()``, and on the AMP path
``is_overflow = math.isnan(grad_norm)`` decides whether the iteration is logged and
validated. Checkpoints hold the model, the optimizer and the learning rate. Hard: apex is
imported conditionally, two paths share one step, and an overflow test on a plain float
drives the logging after the step.
"""

import argparse
import io
import math

import torch

from model import Tacotron2, Tacotron2Loss


def make_batches(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, 10, (4, 5), generator=gen),
            torch.randn(4, 5, 6, generator=gen),
            (torch.rand(4, 5, generator=gen) > 0.7).float(),
        )
        for _ in range(n)
    ]


def validate(model, criterion, val_loader, iteration):
    model.eval()
    with torch.no_grad():
        val_loss = 0.0
        for batch in val_loader:
            x, y = model.parse_batch(batch)
            val_loss += criterion(model(x), y).item()
        val_loss = val_loss / len(val_loader)
    model.train()
    print(f"validation {iteration} loss {val_loss!r}")


def save_checkpoint(model, optimizer, learning_rate, iteration, buffer):
    torch.save(
        {
            "iteration": iteration,
            "state_dict": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "learning_rate": learning_rate,
        },
        buffer,
    )


def train(hparams):
    torch.manual_seed(0)
    model = Tacotron2()
    learning_rate = hparams.learning_rate
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate, weight_decay=hparams.weight_decay)
    if hparams.fp16_run:
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    criterion = Tacotron2Loss()
    train_loader, val_loader = make_batches(4, seed=1), make_batches(2, seed=2)

    iteration = 0
    model.train()
    is_overflow = False
    for epoch in range(hparams.epochs):
        for i, batch in enumerate(train_loader):
            if iteration in hparams.anneal_steps:
                learning_rate = learning_rate * hparams.anneal_factor
            for param_group in optimizer.param_groups:
                param_group["lr"] = learning_rate

            model.zero_grad()
            x, y = model.parse_batch(batch)
            y_pred = model(x)

            loss = criterion(y_pred, y)
            reduced_loss = loss.item()
            if hparams.fp16_run:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()

            if hparams.fp16_run:
                grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), hparams.grad_clip_thresh)
                is_overflow = math.isnan(grad_norm)
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hparams.grad_clip_thresh)

            optimizer.step()

            if not is_overflow:
                print(f"step {iteration} loss {reduced_loss!r} grad_norm {float(grad_norm)!r} lr {learning_rate!r}")

            if not is_overflow and iteration % hparams.iters_per_checkpoint == 0:
                validate(model, criterion, val_loader, iteration)
                save_checkpoint(model, optimizer, learning_rate, iteration, io.BytesIO())
            iteration += 1
    final_scale = amp.state_dict()["loss_scaler0"]["loss_scale"] if hparams.fp16_run else 1.0
    print(f"final scale {final_scale!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16-run", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--weight-decay", type=float, default=1e-6)
    parser.add_argument("--grad-clip-thresh", type=float, default=1.0)
    parser.add_argument("--iters-per-checkpoint", type=int, default=3)
    parser.add_argument("--anneal-factor", type=float, default=0.3)
    hparams = parser.parse_args()
    hparams.anneal_steps = [4, 6]
    train(hparams)


if __name__ == "__main__":
    main()
