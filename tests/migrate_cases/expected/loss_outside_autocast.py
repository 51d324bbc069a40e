import roundpipe
import torch
import torch.nn.functional as F

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, batches, device):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler(enabled=device != "cuda" or torch.cuda.is_available())
    for x, y in batches:
        with torch.autocast(device_type=device, dtype=torch.bfloat16):

            def _loss_fn(logits, y):
                with torch.autocast(device_type=device, enabled=False):
                    # the loss in full precision, outside autocast
                    loss = F.cross_entropy(logits.float(), y)
                return scaler.scale(loss) / NUM_MICROBATCH

            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()
