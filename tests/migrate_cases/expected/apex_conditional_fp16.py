import roundpipe
import torch


def train(model, optimizer, batches, fp16):
    if fp16:
        model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O1")
    else:
        model, optimizer = roundpipe.compat.initialize(model, optimizer, enabled=False)
    amp_scaler = roundpipe.compat.loss_scaler()
    for x, y in batches:
        loss = (model(x) - y).pow(2).mean()
        if fp16:
            with model.scale_loss(loss, amp_scaler) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()
