import torch
from apex import amp


def setup(model, optimizer):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    amp._amp_state.loss_scalers[0]._loss_scale = 2.0 ** 20  # start from a larger scale
    return model, optimizer
