"""Shape: apex ``amp.initialize`` results assigned to attributes (issue 10, shape 12).

A ``Learner`` class builds model and optimizer on ``self`` and rebinds both from
``amp.initialize(self.model, self.optimizer, opt_level=..., loss_scale="dynamic")``; the step
method uses ``with amp.scale_loss(loss, self.optimizer) as scaled_loss`` and clips
``amp.master_params(self.optimizer)``; checkpoints hold ``amp.state_dict()`` and are
restored with ``amp.load_state_dict``. Runs with the apex stand-in in tests/fake_apex.
Hard: the apex objects are attributes, and amp's state is global, not an object.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp


class Learner:
    def __init__(self, opt_level="O1", lr=0.05):
        self.model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level=opt_level, loss_scale="dynamic", verbosity=0)
        self.steps = 0

    def fit_batch(self, x, y):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(x), y)
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 2.0)
        self.optimizer.step()
        self.steps += 1
        return loss.item()

    def checkpoint(self):
        return {"model": copy.deepcopy(self.model.state_dict()), "optimizer": copy.deepcopy(self.optimizer.state_dict()), "amp": amp.state_dict()}

    def restore(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        amp.load_state_dict(state["amp"])


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(24)
    batches = [(torch.randn(12, 6, generator=gen), torch.randint(0, 3, (12,), generator=gen)) for _ in range(8)]
    learner = Learner()
    for x, y in batches[:4]:
        print(f"step {learner.steps} loss {learner.fit_batch(x, y)!r}")
    state = learner.checkpoint()
    resumed = Learner()
    resumed.restore(state)
    resumed.steps = learner.steps
    for x, y in batches[4:]:
        print(f"step {resumed.steps} loss {resumed.fit_batch(x, y)!r}")
    print(f"final scale {amp.state_dict()['loss_scaler0']['loss_scale']!r}")


if __name__ == "__main__":
    main()
