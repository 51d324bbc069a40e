import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, head, data):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    opt_a = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    head = roundpipe.RoundPipe(head, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    opt_b = torch.optim.SGD(head.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())
    for x, y in data:
        loss = (head(model(x)) - y).pow(2).mean()
        scaler.scale(loss).backward()

        def _step_fn():
            scaler.step(opt_a)

        model.step(_step_fn)

        def _step_fn_2():
            scaler.step(opt_b)

        head.step(_step_fn_2)
        scaler.update()
