import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    dec = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    enc = roundpipe.RoundPipe(enc, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    opt_enc = torch.optim.Adam(enc.optim_parameters(), lr=3e-3)
    dec = roundpipe.RoundPipe(dec, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    opt_dec = torch.optim.SGD(dec.optim_parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt_dec, 2, 0.5)
    scaler = roundpipe.GradScaler(init_scale=2.0**20, growth_interval=2)
    gen = torch.Generator().manual_seed(3)
    for i in range(8):
        x = torch.randn(16, 8, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(dec(enc(x)).float(), x)
        if i == 2:
            loss = loss * float("inf")
        scaler.scale(loss).backward()

        def _step_fn():
            scaler.unscale_(opt_enc)
            torch.nn.utils.clip_grad_norm_(enc.optim_parameters(), 0.5)
            scaler.step(opt_enc)
            opt_enc.zero_grad()

        enc.step(_step_fn)

        def _step_fn_2():
            scaler.step(opt_dec)
            sched.step()
            opt_dec.zero_grad()

        dec.step(_step_fn_2)
        scaler.update()
        print(f"step {i} loss {loss.item()!r} scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
