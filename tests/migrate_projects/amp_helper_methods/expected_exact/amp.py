"""The project's AMP helper in RoundPipe form: ``unscale`` and ``optimizer_step`` run their
scaler call in a step function of the model they are given; ``update()`` stays after the step."""

import roundpipe
import torch


class AMPScaler:
    """Scales the loss, unscales before clipping, steps and updates the scale."""

    def __init__(self, enabled=True, scaler=None, *, model):
        self._model = model
        self.scaler = scaler or roundpipe.GradScaler(init_scale=2.0**10, enabled=enabled)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer):
        # clipping needs the true gradients
        def _step_fn():
            self.scaler.unscale_(optimizer)

        self._model.step(_step_fn, is_async=False)

    def optimizer_step(self, optimizer):
        def _step_fn_2():
            self.scaler.step(optimizer)

        self._model.step(_step_fn_2, is_async=False)
        self.scaler.update()

    def get_scale(self):
        return self.scaler.get_scale()

    def state_dict(self):
        return self.scaler.state_dict()

    def load_state_dict(self, state_dict):
        self.scaler.load_state_dict(state_dict)
