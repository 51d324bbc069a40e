import roundpipe
import torch
import torch.nn.functional as F

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, loader, max_steps):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.01)
    scaler = roundpipe.GradScaler(growth_interval=100)
    step = 0
    it = iter(loader)
    while step < max_steps:
        batch = next(it)
        x, y = batch["x"], batch["y"]

        def _loss_fn(_outputs, y):
            loss = F.mse_loss(_outputs, y)  # forward inside the loss call
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
        if step % 10 == 0:
            print(step, loss.item(), scaler.get_scale())
        step += 1
