"""amp.initialize results held on self in a trainer class (issue 10, shape 12)."""

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


class Learner:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.model, self.optimizer = roundpipe.compat.initialize(self.model, self.optimizer, opt_level="O2")

    def fit(self, x, y):
        amp_scaler = roundpipe.compat.loss_scaler()

        def _loss_fn(_outputs, y):
            loss = torch.nn.functional.mse_loss(_outputs, y)
            _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
            return amp_scaler.scale(loss) / NUM_MICROBATCH

        _losses = []
        self.model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)
        loss = sum(_losses)

        def _step_fn():
            amp_scaler.step(self.optimizer)
            self.optimizer.zero_grad()

        self.model.step(_step_fn)
        amp_scaler.update()
        return loss.item()

    def save(self):
        self.model.synchronize()
        return {"model": self.model.model.state_dict(), "amp": roundpipe.compat.state_dict()}
