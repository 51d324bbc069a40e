"""Rule: forward + loss -> model.forward_backward(loss_fn=...), only what the loss needs.

Between the loss and the backward this loop counts samples and fetches the next batch (the
prefetching shape of many trainers). Only the forward and the loss move into the loss
function; the bookkeeping and the fetch stay on the main thread, after the forward, in the
same order. The huge initial scale makes loss * scale overflow float32 for the first steps:
the logged loss must stay the real loss.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.01)
    scaler = roundpipe.GradScaler(init_scale=2.0 ** 127)
    data = iter([(torch.randn(16, 8), 10 * torch.randn(16, 1)) for _ in range(13)])
    seen = 0
    x, y = next(data)
    for step in range(12):
        with torch.autocast("cpu", dtype=torch.bfloat16):

            def _loss_fn(out, y):
                loss = nn.functional.mse_loss(out.float(), y)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)
            loss = sum(_losses)
        seen += x.shape[0]  # bookkeeping: stays where it runs
        x, y = next(data)  # the next batch: fetched after this loss, as before

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()
        print(f"step {step} loss {loss.item():.6f} seen {seen} scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
