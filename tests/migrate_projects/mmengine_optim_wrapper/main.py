"""Shape: an mmengine-style runner (held-out round; the model owns its train step).

``optim_wrapper.AmpOptimWrapper`` holds the optimizer and a GradScaler; the model's own
``train_step(data, optim_wrapper)`` runs its forward inside ``optim_wrapper.optim_context(self)``
(autocast there), parses a dict of losses into the total and a log dict, and hands the total
to ``optim_wrapper.update_params`` (divided by ``accumulative_counts``, scaled backward,
unscale/clip/step/update and ``zero_grad`` on update iterations). The loop only calls
``model.train_step``, writes a per-iteration warm-up lr into the wrapper's optimizer and logs
``optim_wrapper.get_lr()``; the checkpoint holds ``optim_wrapper.state_dict()`` (with the
scaler inside) and the run resumes. Hard: the step is reached through a method of the model
itself, and no scaler call is visible in the loop or in the model.
"""

import io

import torch
import torch.nn as nn
import torch.nn.functional as F

from optim_wrapper import AmpOptimWrapper


class BaseModel(nn.Module):
    def train_step(self, data, optim_wrapper):
        with optim_wrapper.optim_context(self):
            losses = self(*data, mode="loss")
        parsed_losses, log_vars = self.parse_losses(losses)
        optim_wrapper.update_params(parsed_losses)
        return log_vars

    def parse_losses(self, losses):
        log_vars = {name: value.mean() for name, value in losses.items()}
        loss = sum(value for key, value in log_vars.items() if "loss" in key)
        log_vars["loss"] = loss
        return loss, {key: value.item() for key, value in log_vars.items()}


class Classifier(BaseModel):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, inputs, labels, mode="tensor"):
        logits = self.head(self.backbone(inputs))
        if mode == "loss":
            return {"loss_cls": F.cross_entropy(logits, labels), "acc": (logits.argmax(1) == labels).float()}
        return logits


def build_loader(gen, n):
    return [(torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(n)]


def run(model, optim_wrapper, loader, start_iter, max_iters, base_lr, warmup_iters):
    optim_wrapper.initialize_count_status(model, start_iter, max_iters)
    model.train()
    for it in range(start_iter, max_iters):
        if it < warmup_iters:
            for group in optim_wrapper.optimizer.param_groups:
                group["lr"] = base_lr * (it + 1) / warmup_iters
        log_vars = model.train_step(loader[it % len(loader)], optim_wrapper)
        print(f"step {it} loss {log_vars['loss']!r} acc {log_vars['acc']!r} lr {optim_wrapper.get_lr()['lr'][0]!r}")


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(17)
    loader = build_loader(gen, 4)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optim_wrapper = AmpOptimWrapper(optimizer=optimizer, accumulative_counts=2, clip_grad=dict(max_norm=1.0))
    run(model, optim_wrapper, loader, 0, 6, base_lr=0.05, warmup_iters=3)

    buffer = io.BytesIO()
    torch.save({"state_dict": model.state_dict(), "optimizer": optim_wrapper.state_dict(), "iter": 6}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=False)
    model.load_state_dict(checkpoint["state_dict"])
    optim_wrapper.load_state_dict(checkpoint["optimizer"])
    run(model, optim_wrapper, loader, checkpoint["iter"], 9, base_lr=0.05, warmup_iters=3)
    print(f"final scale {optim_wrapper.loss_scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
