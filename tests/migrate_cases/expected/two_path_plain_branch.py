"""Two-path AMP: an optional scaler (None without AMP) guarded by `is not None`, the plain
branch with its own backward and step; both take RoundPipe's form."""

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, loader, use_amp, clip):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1, momentum=0.9)
    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available()) if use_amp else None
    for x, y in loader:
        model.synchronize()
        optimizer.zero_grad()
        model.zero_grad()
        with torch.autocast("cuda", enabled=use_amp):
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()  # AMP path

            def _step_fn():
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), clip)
                scaler.step(optimizer)

            model.step(_step_fn)
            scaler.update()
        else:
            loss.backward()  # plain path

            def _step_fn_2():
                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), clip)
                optimizer.step()

            model.step(_step_fn_2)
        print(f"loss {loss.item():.4f}")
