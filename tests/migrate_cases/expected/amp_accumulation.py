"""Mixed-precision training with gradient accumulation and a step LR schedule.

Gradients from `accum_steps` micro-batches are summed before one optimizer
step. The scaler is stepped and updated only on those boundaries.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    num_classes = 5
    model = nn.Sequential(
        nn.Linear(20, 48),
        nn.GELU(),
        nn.Linear(48, num_classes),
    ).to(device)
    criterion = nn.CrossEntropyLoss()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = roundpipe.GradScaler(enabled=device != "cuda" or torch.cuda.is_available())

    accum_steps = 4
    num_iters = 24  # 6 optimizer steps

    # Synthetic micro-batches: random features with integer class labels.
    inputs_all = torch.randn(num_iters, 16, 20)
    labels_all = torch.randint(0, num_classes, (num_iters, 16))

    model.train()
    model.synchronize()
    optimizer.zero_grad()
    model.zero_grad()
    for i in range(num_iters):
        inputs = inputs_all[i].to(device)
        targets = labels_all[i].to(device)

        with torch.autocast(device_type=device, dtype=torch.bfloat16):

            def _loss_fn(output, targets):
                loss = criterion(output, targets)
                # Average over the accumulation window.
                loss = loss / accum_steps
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
            loss = sum(_losses)

        # Gradients keep accumulating in .grad until the next optimizer step.

        if (i + 1) % accum_steps == 0:

            def _step_fn():
                scaler.step(optimizer)
                optimizer.zero_grad()
                # The schedule advances once per real optimizer step.
                scheduler.step()

            model.step(_step_fn)
            scaler.update()

        print(f"step {i} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
