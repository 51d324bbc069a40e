import roundpipe
import torch
from torch.cuda import amp

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, data, lr):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=lr)
    scaler = roundpipe.GradScaler(2.0 ** 10, 3.0, enabled=torch.cuda.is_available())  # legacy spelling
    for x, y in data:
        with amp.autocast(torch.cuda.is_available()):

            def _loss_fn(pred, y):
                loss = ((pred - y) ** 2).mean()
                return scaler.scale(loss) / NUM_MICROBATCH

            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()
