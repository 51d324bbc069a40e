"""Rule loss_scaler_wrapper, near-miss: a wrapper already in RoundPipe form (roundpipe.GradScaler,
the optimizer work in self._model.step) is left alone."""

import roundpipe
import torch


class ScalerWithGradNorm:
    def __init__(self, *, model):
        self._model = model
        self._scaler = roundpipe.GradScaler("cuda")

    def __call__(self, loss, optimizer, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:

            def _step_fn():
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, 1.0)
                self._scaler.step(optimizer)

            self._model.step(_step_fn)
            self._scaler.update()


def train(model, loader):
    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    loss_scaler = ScalerWithGradNorm(model=model)
    for x, y in loader:
        loss_scaler(torch.nn.functional.mse_loss(model(x), y), optimizer, parameters=model.optim_parameters())
