"""amp.initialize results held on self in a trainer class (issue 10, shape 12)."""

import torch
from apex import amp


class Learner:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O2")

    def fit(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.item()

    def save(self):
        return {"model": self.model.state_dict(), "amp": amp.state_dict()}
