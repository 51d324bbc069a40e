import roundpipe
import torch
from torch import nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main(loader, accum_steps=4):
    model = nn.Linear(8, 2)
    criterion = nn.CrossEntropyLoss()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    scaler = roundpipe.GradScaler(init_scale=1024.0)

    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):

            def _loss_fn(out, y):
                loss = criterion(out, y) / accum_steps  # average over the accumulation window
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)
            loss = sum(_losses)
        running = loss.item()
        if (i + 1) % accum_steps == 0:
            # clip on unscaled gradients
            def _step_fn():
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), max_norm=1.0)
                scaler.step(optimizer)
                optimizer.zero_grad()
                scheduler.step()

            model.step(_step_fn)
            scaler.update()
            print(f"step {i} loss {running:.4f} scale {scaler.get_scale()}")
