"""Shape: a loss-scaler wrapper class defined in the project (issue 10, shape 2), migrated
by hand: the --exact target.

Autograd form through the wrapper: the model is wrapped where it is built, the optimizer
takes its copies, the wrapper is handed the model it steps, and checkpoints hold the wrapped
module (after ``synchronize()``), so their keys are the original's.

Original docstring:

``util/misc.py`` defines the MAE/BEiT-style wrapper: ``__call__(loss, optimizer, clip_grad,
parameters, create_graph, update_grad)`` scales and backpropagates, and on update steps
unscales, clips (or measures the grad norm), steps and updates, returning the norm; it has
``state_dict_key``/``state_dict``/``load_state_dict``. ``engine.py`` calls it with an
``update_grad`` accumulation flag, ``main.py`` builds it and checkpoints through helpers that
store it under ``state_dict_key``. Hard: no scaler call appears where the training happens,
and the wrapper, every call site and the checkpoint helpers have to change together.
"""

import os
import tempfile

import roundpipe
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from engine import train_one_epoch
from util.misc import ScalerWithGradNorm, load_model, save_model


def build_model():
    return roundpipe.RoundPipe(nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, 5)))


def main():
    torch.manual_seed(0)
    features = torch.randn(96, 12)
    labels = torch.randint(0, 5, (96,))
    loader = DataLoader(TensorDataset(features, labels), batch_size=16, shuffle=False)
    model = build_model()
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=2e-3, betas=(0.9, 0.95))
    loss_scaler = ScalerWithGradNorm(model)
    step = train_one_epoch(model, loader, optimizer, loss_scaler, epoch=0, clip_grad=0.5)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint-0.pth")
        model.synchronize()
        save_model(path, model.model, optimizer, loss_scaler, epoch=0)
        model = build_model()
        optimizer = torch.optim.AdamW(model.optim_parameters(), lr=2e-3, betas=(0.9, 0.95))
        loss_scaler = ScalerWithGradNorm(model, init_scale=1.0)
        start_epoch = load_model(path, model.model, optimizer, loss_scaler)
    train_one_epoch(model, loader, optimizer, loss_scaler, epoch=start_epoch, start_step=step)
    print(f"final scale {loss_scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
