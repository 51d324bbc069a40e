"""Shape: apex ``amp.initialize`` of locals, results held on ``self`` (issue 10, shape 12).

A ``Trainer`` builds its model and optimizer (and an LR scheduler on it) in locals of
``__init__``, then ``self.model, self.optimizer = amp.initialize(model, optimizer, ...)``;
the locals are not used after that line. The step method computes a dict of losses, stops on
a non-finite loss, and clips ``amp.master_params(self.optimizer)``; checkpoints hold
``amp.state_dict()``. Runs with the apex stand-in in tests/fake_apex.
Hard: initialize's arguments are not the attributes it rebinds.
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
        out = self.model(x)
        loss_dict = {"ce": F.cross_entropy(out.float(), y), "l2": 1e-3 * out.float().pow(2).mean()}
        losses = sum(loss_dict.values())
        loss_value = losses.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training")
            raise SystemExit(1)
        self.optimizer.zero_grad()
        with amp.scale_loss(losses, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss_value, {k: v.item() for k, v in loss_dict.items()}


def main():
    tr = Trainer()
    folder = tempfile.mkdtemp()
    tr.resume(os.path.join(folder, "ck.pt"))  # nothing saved yet
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(8)]
    for i, (x, y) in enumerate(data):
        lv, ld = tr.train_step(x, y)
        print(f"step {tr.step} loss {lv!r} {ld!r}")
    tr.save(os.path.join(folder, "ck.pt"))
    tr.resume(os.path.join(folder, "ck.pt"))
    print(f"final scale {amp.state_dict()['loss_scaler0']['loss_scale']!r}")


if __name__ == "__main__":
    main()
