"""``apex.optimizers`` stand-in: FusedAdam and FusedSGD as the torch optimizers with their update
rules (apex's CUDA kernels are not reproduced bit for bit)."""

import torch


class FusedAdam(torch.optim.AdamW):
    """apex's FusedAdam signature; ``adam_w_mode=True`` (apex's default) is AdamW's rule,
    ``False`` Adam's L2 rule."""

    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-8,
        adam_w_mode=True,
        weight_decay=0.0,
        amsgrad=False,
        set_grad_none=True,
    ):
        if not bias_correction:
            raise NotImplementedError("stand-in: bias_correction=False")
        if adam_w_mode:
            super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        else:
            torch.optim.Adam.__init__(
                self, params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad
            )


class FusedSGD(torch.optim.SGD):
    """apex's FusedSGD signature; ``wd_after_momentum=False`` (the default) is SGD's rule."""

    def __init__(
        self,
        params,
        lr,
        momentum=0.0,
        dampening=0.0,
        weight_decay=0.0,
        nesterov=False,
        wd_after_momentum=False,
        materialize_master_grads=True,
        set_grad_none=False,
    ):
        if wd_after_momentum:
            raise NotImplementedError("stand-in: wd_after_momentum=True")
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov)
