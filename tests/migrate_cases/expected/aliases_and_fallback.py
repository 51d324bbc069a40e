"""Aliased imports, an import inside a function and a try/except fallback."""
import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

# older torch


def run(model, batches, use_amp):
    from torch.amp import autocast as ac

    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))

    opt = torch.optim.Adam(model.optim_parameters())
    scaler = roundpipe.GradScaler(enabled=use_amp and torch.cuda.is_available())
    for batch in batches:
        inputs, labels = batch
        with ac("cuda", enabled=use_amp):

            def _loss_fn(logits, labels):
                loss = torch.nn.functional.cross_entropy(logits, labels)
                return scaler.scale(loss) / NUM_MICROBATCH

            model.forward_backward(input_args=(inputs,), label=labels, loss_fn=_loss_fn)

        def _step_fn():
            scaler.step(opt)
            opt.zero_grad(set_to_none=True)

        model.step(_step_fn)
        scaler.update()
    spare = roundpipe.GradScaler(enabled=False)  # the legacy alias, never stepped
    print(spare.get_scale())
