"""Shape: apex's ImageNet example (issue 10, shapes 10 and 12).

A module-level ``args`` set by ``main()`` through ``global``; ``amp.initialize(model,
optimizer, opt_level=args.opt_level, keep_batchnorm_fp32=args.keep_batchnorm_fp32,
loss_scale=args.loss_scale)`` with values from argparse; apex DDP only ``if
args.distributed``; ``train()`` adjusts the learning rate by hand every iteration (a helper
writing ``param_groups``), zeroes the gradients after the forward, backpropagates through
``with amp.scale_loss(loss, optimizer) as scaled_loss``, steps, and every ``print_freq``
iterations measures top-1 from the outputs of the step; ``validate()`` evaluates under
``torch.no_grad()``; the checkpoint holds ``model.state_dict()`` and the optimizer's.
Runs with the apex stand-in in tests/fake_apex. Hard: run-time apex settings, a global
``args``, and an lr helper handed the optimizer before each step.
"""

import argparse
import io
import os

import torch
import torch.nn as nn
from apex import amp
from apex.parallel import DistributedDataParallel as DDP

args = None


class Net(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.fc = nn.Linear(6, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


def accuracy(output, target):
    pred = output.argmax(dim=1)
    return pred.eq(target).float().mean().item() * 100.0


def adjust_learning_rate(optimizer, epoch, step, len_epoch):
    """Warm up over the first epoch, then decay by 10 every two epochs."""
    factor = epoch // 2
    lr = args.lr * (0.1**factor)
    if epoch < 1:
        lr = lr * float(1 + step + epoch * len_epoch) / (1.0 * len_epoch)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def train(train_loader, model, criterion, optimizer, epoch):
    model.train()
    for i, (input, target) in enumerate(train_loader):
        adjust_learning_rate(optimizer, epoch, i, len(train_loader))
        output = model(input)
        loss = criterion(output, target)

        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()

        if i % args.print_freq == 0:
            prec1 = accuracy(output.data, target)
            reduced_loss = loss.data
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            print(f"step {epoch * len(train_loader) + i} loss {float(reduced_loss)!r} prec1 {prec1!r}")


def validate(val_loader, model, criterion):
    model.eval()
    total, correct = 0.0, 0.0
    for input, target in val_loader:
        with torch.no_grad():
            output = model(input)
            loss = criterion(output, target)
        total += float(loss)
        correct += accuracy(output, target)
    print(f"val loss {total / len(val_loader)!r} prec1 {correct / len(val_loader)!r}")
    return correct / len(val_loader)


def make_loader(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 3, 5, 5, generator=gen), torch.randint(0, 4, (6,), generator=gen)) for _ in range(n)]


def main():
    global args
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=6)
    parser.add_argument("--print-freq", type=int, default=1)
    parser.add_argument("--opt-level", type=str, default="O1")
    parser.add_argument("--keep-batchnorm-fp32", type=str, default=None)
    parser.add_argument("--loss-scale", type=str, default="dynamic")
    args = parser.parse_args()
    args.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    args.world_size = 1
    args.lr = args.lr * float(args.batch_size * args.world_size) / 8.0

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level=args.opt_level,
        keep_batchnorm_fp32=args.keep_batchnorm_fp32,
        loss_scale=args.loss_scale,
        verbosity=0,
    )
    if args.distributed:
        model = DDP(model, delay_allreduce=True)
    criterion = nn.CrossEntropyLoss()
    train_loader, val_loader = make_loader(3, seed=1), make_loader(2, seed=2)

    best_prec1 = 0.0
    checkpoint = io.BytesIO()
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer, epoch)
        prec1 = validate(val_loader, model, criterion)
        is_best = prec1 > best_prec1
        best_prec1 = max(prec1, best_prec1)
        state = {
            "epoch": epoch + 1,
            "state_dict": model.state_dict(),
            "best_prec1": best_prec1,
            "optimizer": optimizer.state_dict(),
        }
        if is_best:
            checkpoint = io.BytesIO()
            torch.save(state, checkpoint)
    print(f"final scale {amp.state_dict()['loss_scaler0']['loss_scale']!r}")


if __name__ == "__main__":
    main()
