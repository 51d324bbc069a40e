"""Project rule: a trainer split over two files migrates; the model class stays in
models.py, the model object is built and trained here."""

import roundpipe
import torch

from models import Regressor

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    model = Regressor()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)
    scaler = roundpipe.GradScaler(init_scale=1024.0)
    batches = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(8)]
    for step, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):

            def _loss_fn(out, y):
                loss = torch.nn.functional.mse_loss(out.float(), y)
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
        print(f"step {step} loss {loss.item():.6f} scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
