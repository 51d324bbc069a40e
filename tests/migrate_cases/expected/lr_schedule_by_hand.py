"""Rule: main-thread writes of optimizer state are ordered after the running step.

The learning rate is written by hand into every param group after each step (warm-up then
decay, as many trainers do). In the asynchronous RoundPipe form the step function may still
be running on the optimizer thread at that moment, so `model.synchronize()` is put before
the write (and before the print that reads the lr); with --exact the step has finished
when `model.step` returns and nothing is added.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def lr_at(step):
    return 0.1 * min(1.0, (step + 1) / 4) * 0.9 ** step


def main():
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=lr_at(0))
    scaler = roundpipe.GradScaler()
    batches = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(8)]
    for step, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):

            def _loss_fn(_outputs, y):
                loss = nn.functional.mse_loss(_outputs.float(), y)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)
            loss = sum(_losses)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()
        model.synchronize()
        for group in optimizer.param_groups:  # the schedule, by hand
            group["lr"] = lr_at(step + 1)
        print(f"step {step} loss {loss.item():.6f} lr {optimizer.param_groups[0]['lr']:.6f}")


if __name__ == "__main__":
    main()
