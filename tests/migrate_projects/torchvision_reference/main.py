"""Shape: torchvision's classification reference (issue 10, shapes 4, 9 and 10).

``train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args,
model_ema=None, scaler=None)`` enters ``torch.autocast(..., enabled=scaler is not None)``,
takes the scaler path or the plain path (both clip when ``args.clip_grad_norm`` is set),
then every ``args.model_ema_steps`` iterations updates an ``AveragedModel``-based EMA built
from ``model_without_ddp`` (and resets its counter during warm-up); top-1 accuracy is read
from the outputs after the step. The scheduler steps once per epoch in ``main``;
``evaluate`` runs under ``@torch.inference_mode()`` on the model and on the EMA; checkpoints
hold ``model_without_ddp``, the EMA and, when AMP is on, the scaler. Hard: the EMA reads the
parameters right after each step, and the outputs are used after the step.
"""

import argparse
import io

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.head(x.mean(dim=(2, 3)))


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """An EMA of the parameters and buffers, as the reference scripts keep one."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def accuracy(output, target):
    with torch.inference_mode():
        pred = output.argmax(dim=1)
        return (pred == target).float().mean().item() * 100.0


def make_loader(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, 6, 6, generator=gen), torch.randint(0, 5, (8,), generator=gen)) for _ in range(n)]


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, model_ema=None, scaler=None):
    model.train()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)

        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            if args.clip_grad_norm is not None:
                # we should unscale the gradients of optimizer's assigned params if do gradient clipping
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if args.clip_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            optimizer.step()

        if model_ema and i % args.model_ema_steps == 0:
            model_ema.update_parameters(model)
            if epoch < args.lr_warmup_epochs:
                # Reset ema buffer to keep copying weights during warmup period
                model_ema.n_averaged.fill_(0)

        acc1 = accuracy(output, target)
        step = epoch * len(data_loader) + i
        print(f"step {step} loss {loss.item()!r} acc1 {acc1!r} lr {optimizer.param_groups[0]['lr']!r}")


@torch.inference_mode()
def evaluate(model, criterion, data_loader, device, log_suffix=""):
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    for image, target in data_loader:
        output = model(image.to(device))
        loss_sum += criterion(output, target).item() * image.shape[0]
        correct += (output.argmax(dim=1) == target).sum().item()
        total += image.shape[0]
    print(f"eval{log_suffix} loss {loss_sum / total!r} acc1 {100.0 * correct / total!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--clip-grad-norm", type=float, default=1.0)
    parser.add_argument("--model-ema-steps", type=int, default=2)
    parser.add_argument("--model-ema-decay", type=float, default=0.9)
    parser.add_argument("--lr-warmup-epochs", type=int, default=1)
    args = parser.parse_args()
    device = torch.device("cpu")
    torch.manual_seed(0)
    train_loader, val_loader = make_loader(4, seed=1), make_loader(2, seed=2)

    model = SmallNet()
    model.to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3) if args.amp else None
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=args.lr_warmup_epochs)
    main_lr = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs - args.lr_warmup_epochs)
    lr_scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer, schedulers=[warmup, main_lr], milestones=[args.lr_warmup_epochs]
    )
    model_without_ddp = model
    model_ema = ExponentialMovingAverage(model_without_ddp, decay=args.model_ema_decay, device=device)

    buffer = io.BytesIO()
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, optimizer, train_loader, device, epoch, args, model_ema, scaler)
        lr_scheduler.step()
        evaluate(model, criterion, val_loader, device=device)
        evaluate(model_ema, criterion, val_loader, device=device, log_suffix="EMA")
        checkpoint = {
            "model": model_without_ddp.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict(),
            "epoch": epoch,
            "args": args,
        }
        if model_ema:
            checkpoint["model_ema"] = model_ema.state_dict()
        if scaler:
            checkpoint["scaler"] = scaler.state_dict()
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)

    buffer.seek(0)
    restored = SmallNet()
    restored.load_state_dict(torch.load(buffer, weights_only=False)["model"])
    evaluate(restored, criterion, val_loader, device=device, log_suffix="restored")
    print(f"final scale {scaler.get_scale() if scaler is not None else None!r}")


if __name__ == "__main__":
    main()
