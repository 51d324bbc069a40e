"""Training utilities: the loss scaler wrapper and checkpoint helpers."""

import torch


def grad_norm(parameters, norm_type=2.0):
    parameters = [p for p in parameters if p.grad is not None]
    if not parameters:
        return torch.tensor(0.0)
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type) for p in parameters]), norm_type)


class ScalerWithGradNorm:
    """Owns the GradScaler: backward every call, optimizer work only on update steps."""

    state_dict_key = "amp_scaler"

    def __init__(self, init_scale=2.0**14):
        self._scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=3)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if not update_grad:
            return None
        if clip_grad is not None:
            assert parameters is not None
            self._scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        else:
            self._scaler.unscale_(optimizer)
            norm = grad_norm(parameters)
        self._scaler.step(optimizer)
        self._scaler.update()
        return norm

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
