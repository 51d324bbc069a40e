"""An EMA copy built from the model after the optimizer (timm's ModelEmaV2) and updated every
step: it is built from and updated with the wrapped module (model.model), one step stale in
the default form (rule model_averages)."""

import roundpipe
import torch
from timm.utils import ModelEmaV2

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main(loader):
    model = torch.nn.Linear(8, 2)
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    model_ema = ModelEmaV2(model.model, decay=0.999)
    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())
    for x, y in loader:
        with torch.autocast("cuda"):

            def _loss_fn(_outputs, y):
                loss = torch.nn.functional.cross_entropy(_outputs, y)
                return scaler.scale(loss) / NUM_MICROBATCH

            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()
        model_ema.update(model.model)
