import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

def main(model, loader, val_x):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler()
    for x, y in loader:

        def _loss_fn(_outputs, y):
            loss = torch.nn.functional.mse_loss(_outputs, y)
            return scaler.scale(loss) / NUM_MICROBATCH

        model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)

        def _step_fn():
            scaler.step(optimizer)

        model.step(_step_fn)
        scaler.update()
        model.synchronize()
        with torch.no_grad():
            pred = model(val_x)
        print(pred.mean().item())
