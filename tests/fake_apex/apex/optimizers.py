"""``apex.optimizers`` stand-in: FusedAdam as the torch optimizer with its update rule."""

import torch


class FusedAdam(torch.optim.AdamW):
    """apex's FusedAdam signature; ``adam_w_mode=True`` (apex's default) is AdamW's rule,
    ``False`` Adam's L2 rule."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True):
        if not bias_correction:
            raise NotImplementedError("stand-in: bias_correction=False")
        if adam_w_mode:
            super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        else:
            torch.optim.Adam.__init__(self, params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
