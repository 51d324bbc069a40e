"""Training utilities: the loss scaler wrapper and checkpoint helpers.

Migrated by hand (the --exact target): the wrapper keeps its interface and its state, owns
RoundPipe's scaler and the RoundPipe model it steps; the optimizer work of an update step
runs in ``model.step``'s step function and the norm it measured is returned as before.
"""

import roundpipe
import torch


def grad_norm(parameters, norm_type=2.0):
    parameters = [p for p in parameters if p.grad is not None]
    if not parameters:
        return torch.tensor(0.0)
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type) for p in parameters]), norm_type)


class ScalerWithGradNorm:
    """Owns the GradScaler: backward every call, optimizer work only on update steps."""

    state_dict_key = "amp_scaler"

    def __init__(self, model, init_scale=2.0**14):
        self._model = model
        self._scaler = roundpipe.GradScaler(init_scale=init_scale, growth_interval=3)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if not update_grad:
            return None
        norms = []

        def step_fn():
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)
                norms.append(torch.nn.utils.clip_grad_norm_(parameters, clip_grad))
            else:
                self._scaler.unscale_(optimizer)
                norms.append(grad_norm(parameters))
            self._scaler.step(optimizer)

        self._model.step(step_fn, is_async=False)
        self._scaler.update()
        return norms[0]

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)

    def get_scale(self):
        return self._scaler.get_scale()


def save_model(path, model, optimizer, loss_scaler, epoch):
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            loss_scaler.state_dict_key: loss_scaler.state_dict(),
        },
        path,
    )


def load_model(path, model, optimizer, loss_scaler):
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if loss_scaler.state_dict_key in checkpoint:
        loss_scaler.load_state_dict(checkpoint[loss_scaler.state_dict_key])
    return checkpoint["epoch"] + 1
