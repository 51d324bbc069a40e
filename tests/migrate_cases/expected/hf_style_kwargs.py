import roundpipe
import torch
from torch.cuda.amp import autocast

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

model = build_model().cuda()
model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
optimizer = torch.optim.AdamW(model.optim_parameters(), lr=5e-5)
scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())
for epoch in range(3):
    for batch in loader:
        batch = {k: v.cuda() for k, v in batch.items()}
        with autocast():

            def _loss_fn(outputs, _label):
                loss = outputs.loss
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(), input_kwargs=batch, loss_fn=_loss_fn)
            loss = sum(_losses)

        def _step_fn():
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()
    model.synchronize()
    model.eval()
    with torch.no_grad():
        for batch in val_loader:
            print(model(**batch).loss.item())
    model.train()
    torch.save(model.model.state_dict(), f"ckpt{epoch}.pt")
