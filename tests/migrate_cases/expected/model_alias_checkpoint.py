"""Rule: checkpoints keep their keys through an alias of the wrapped model.

`raw_model = model` after the model is built (the shape of GPT trainers) is the same object
as the wrapped model, so its `state_dict()` goes through the wrapped module too, after a
synchronize."""

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main(loader, path):
    model = torch.nn.Linear(8, 2)
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)
    raw_model = model
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
    raw_model.synchronize()
    torch.save({"model": raw_model.model.state_dict(), "scaler": scaler.state_dict()}, path)
