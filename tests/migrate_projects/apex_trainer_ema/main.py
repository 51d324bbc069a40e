"""Shape: an apex trainer class with an EMA copy and an evaluation (issue 10, shape 12).

``__init__`` rebinds ``self.model, self.optimizer`` from ``amp.initialize`` of locals, then
hands the model to ``EMA(self.model)`` (a deep copy updated after each step); the step method
aliases ``model = self.model`` / ``optimizer = self.optimizer`` and works on the aliases;
``evaluate()`` runs forward passes of ``self.model`` (or the EMA copy) in eval mode.
Runs with the apex stand-in in tests/fake_apex.
Hard: the model attribute escapes into other objects, local aliases, and forwards outside
the step. Refused today: the step's alias of ``self.model`` (RPM201) is not followed.
"""

import copy
import math
import os
import tempfile
import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp


class EMA:
    def __init__(self, model, decay=0.8):
        self.ema = copy.deepcopy(model).eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for e, p in zip(self.ema.parameters(), model.parameters()):
            e.copy_(e * self.decay + p.float() * (1 - self.decay))


class Trainer:
    def __init__(self, opt_level="O1"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level=opt_level, loss_scale="dynamic", verbosity=0)
        self.ema = EMA(self.model)
        self.step = 0

    def resume(self, path):
        if not os.path.exists(path):
            return
        ck = torch.load(path)
        self.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        amp.load_state_dict(ck["amp"])
        self.step = ck["step"]
        print("resumed", self.step)

    def save(self, path):
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "amp": amp.state_dict(), "step": self.step}, path)

    def train_step(self, x, y):
        model = self.model
        optimizer = self.optimizer
        out = model(x)
        loss_dict = {"ce": F.cross_entropy(out.float(), y), "l2": 1e-3 * out.float().pow(2).mean()}
        losses = sum(loss_dict.values())
        loss_value = losses.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training")
            raise SystemExit(1)
        optimizer.zero_grad()
        with amp.scale_loss(losses, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        optimizer.step()
        self.scheduler.step()
        self.ema.update(model)
        self.step += 1
        return loss_value, {k: v.item() for k, v in loss_dict.items()}

    @torch.no_grad()
    def evaluate(self, batches, use_ema=False):
        m = self.ema.ema if use_ema else self.model
        m.eval()
        r = sum(F.cross_entropy(m(x).float(), y).item() for x, y in batches)
        self.model.train()
        return r


def main():
    tr = Trainer()
    folder = tempfile.mkdtemp()
    tr.resume(os.path.join(folder, "ck.pt"))  # nothing saved yet
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(8)]
    for i, (x, y) in enumerate(data):
        lv, ld = tr.train_step(x, y)
        print(f"step {tr.step} loss {lv!r} {ld!r}")
        if i % 3 == 2:
            print("val", repr(tr.evaluate(data[:2])), "ema", repr(tr.evaluate(data[:2], use_ema=True)))
    tr.save(os.path.join(folder, "ck.pt"))
    tr.resume(os.path.join(folder, "ck.pt"))
    print(f"final scale {amp.state_dict()['loss_scaler0']['loss_scale']!r}")


if __name__ == "__main__":
    main()
