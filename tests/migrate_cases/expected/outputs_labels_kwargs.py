import roundpipe
import torch
import torch.nn.functional as F

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def fit(model, batches, device):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1, momentum=0.9)
    scaler = roundpipe.GradScaler(enabled=device != "cuda" or torch.cuda.is_available())
    for step, (x, mask, y, w) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        with torch.autocast(device_type=device):

            def _loss_fn(logits, _labels):
                y, w = _labels
                loss = F.cross_entropy(logits, y, reduction="sum") * w.mean()
                _losses.append(loss.detach().cpu())
                return scaler.scale(loss)

            _losses = []
            logits = model.forward_backward(
                input_args=(x,),
                input_kwargs={"attention_mask": mask},
                label=(y, w),
                loss_fn=_loss_fn,
                return_outputs=True,
            )[1]
            loss = sum(_losses)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)

        model.step(_step_fn)
        scaler.update()
        acc = (logits.argmax(-1) == y).float().mean().item()
        print(step, loss.item(), acc)
