"""No-op twin of forward_value_next_iteration: the same loop already in RoundPipe form
(it mentions GradScaler, so it gets past the prefilter) is left alone."""

import roundpipe


def train(model, optimizer, batches):
    scaler = roundpipe.GradScaler("cuda")
    for step, (x, y) in enumerate(batches):
        def _loss_fn(out, y):
            return scaler.scale(torch.nn.functional.mse_loss(out, y))
        loss = model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)
        model.step(lambda: scaler.step(optimizer))
        scaler.update()
