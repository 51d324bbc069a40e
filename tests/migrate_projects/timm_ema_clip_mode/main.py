"""Shape: timm's ``train.py`` (held-out round; a model EMA and a dispatched clip mode).

``timm_utils.NativeScaler`` owns the GradScaler; its ``__call__`` takes ``clip_grad``,
``clip_mode`` (``norm``/``value``/``agc``, dispatched by ``dispatch_clip_grad``),
``parameters``, ``create_graph`` (``second_order``) and ``need_update`` (gradient
accumulation over ``grad_accum_steps``). ``loss_scaler`` is ``None`` without AMP, with a
plain path that clips through the same dispatcher. After every update a ``ModelEmaV2``
(a deep copy updated from ``model.state_dict()``) follows the model, and the scheduler's
``step_update(num_updates)`` writes the learning rate of every group; the logged lr is
the mean over ``optimizer.param_groups``. ``validate`` runs the model and the EMA under
``torch.no_grad()``; the checkpoint holds the model, the EMA, the optimizer and the loss
scaler under its ``state_dict_key``. Hard: the EMA reads the model's weights and the
scheduler writes optimizer state right after every step, through helper objects.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from timm_utils import ModelEmaV2, NativeScaler, StepLRScheduler, dispatch_clip_grad


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def train_one_epoch(
    epoch, model, loader, optimizer, loss_fn, args, lr_scheduler=None, loss_scaler=None, model_ema=None, num_updates=0
):
    second_order = args.second_order
    accum_steps = args.grad_accum_steps
    model.train()
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        need_update = (batch_idx + 1) % accum_steps == 0 or batch_idx + 1 == len(loader)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=loss_scaler is not None):
            output = model(input)
            loss = loss_fn(output, target)
        if accum_steps > 1:
            loss /= accum_steps

        if loss_scaler is not None:
            loss_scaler(
                loss,
                optimizer,
                clip_grad=args.clip_grad,
                clip_mode=args.clip_mode,
                parameters=model.parameters(),
                create_graph=second_order,
                need_update=need_update,
            )
        else:
            loss.backward(create_graph=second_order)
            if need_update:
                if args.clip_grad is not None:
                    dispatch_clip_grad(model.parameters(), value=args.clip_grad, mode=args.clip_mode)
                optimizer.step()

        if not need_update:
            continue
        num_updates += 1
        optimizer.zero_grad()
        if model_ema is not None:
            model_ema.update(model)
        lrl = [param_group["lr"] for param_group in optimizer.param_groups]
        lr = sum(lrl) / len(lrl)
        print(f"step {num_updates} loss {loss.item()!r} lr {lr!r}")
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates)
    return num_updates


@torch.no_grad()
def validate(model, loader, loss_fn, tag):
    model.eval()
    total = 0.0
    for input, target in loader:
        total += loss_fn(model(input), target).item()
    print(f"eval {tag} loss {total / len(loader)!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--clip-grad", type=float, default=0.5)
    parser.add_argument("--clip-mode", default="norm", choices=["norm", "value", "agc"])
    parser.add_argument("--second-order", action="store_true")
    parser.add_argument("--grad-accum-steps", type=int, default=2)
    parser.add_argument("--model-ema-decay", type=float, default=0.8)
    args = parser.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(11)
    loader = [(torch.randn(8, 6, generator=gen), torch.randint(0, 4, (8,), generator=gen)) for _ in range(5)]
    val_loader = loader[:2]

    model = Net()
    model_ema = ModelEmaV2(model, decay=args.model_ema_decay)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    loss_scaler = NativeScaler() if args.amp else None
    lr_scheduler = StepLRScheduler(optimizer, decay_t=2, decay_rate=0.5, warmup_t=2, warmup_lr_init=1e-3)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

    num_updates = 0
    for epoch in range(args.epochs):
        num_updates = train_one_epoch(
            epoch, model, loader, optimizer, loss_fn, args, lr_scheduler, loss_scaler, model_ema, num_updates
        )
        lr_scheduler.step(epoch + 1)
        validate(model, val_loader, loss_fn, "model")
        validate(model_ema.module, val_loader, loss_fn, "ema")
        checkpoint = {
            "epoch": epoch,
            "state_dict": model.state_dict(),
            "state_dict_ema": model_ema.module.state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        if loss_scaler is not None:
            checkpoint[loss_scaler.state_dict_key] = loss_scaler.state_dict()
    print(f"final scale {loss_scaler._scaler.get_scale() if loss_scaler is not None else None!r}")


if __name__ == "__main__":
    main()
