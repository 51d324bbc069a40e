"""timm-style native AMP loss scaler and a clipping dispatcher."""

import torch


def dispatch_clip_grad(parameters, value, mode="norm", norm_type=2.0):
    if mode == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, value, norm_type=norm_type)
    elif mode == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        raise ValueError(f"Unknown clip mode ({mode}).")


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self, device="cpu"):
        self._scaler = torch.amp.GradScaler(device, init_scale=2.0**9, growth_interval=3)

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False, need_update=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if need_update:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale the grads of the optimizer's params in place
                dispatch_clip_grad(parameters, clip_grad, mode=clip_mode)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)
