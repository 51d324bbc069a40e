import torch
import roundpipe


def train(model, data, lr):
    # Already migrated: roundpipe.GradScaler is not rewritten again.
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=lr)
    scaler = roundpipe.GradScaler("cuda", 2.0 ** 10, 3.0)
    for x, y in data:
        loss = model.forward_backward(input_args=(x,), label=y, loss_fn=lambda o, t: scaler.scale(((o - t) ** 2).mean()))
        model.step(lambda: (scaler.step(optimizer), optimizer.zero_grad()))
        scaler.update()
