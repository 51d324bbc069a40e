import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    dec = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    opt_enc = torch.optim.Adam(enc.parameters(), lr=3e-3)
    opt_dec = torch.optim.SGD(dec.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt_dec, 2, 0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=2)
    gen = torch.Generator().manual_seed(3)
    for i in range(8):
        x = torch.randn(16, 8, generator=gen)
        opt_enc.zero_grad()
        dec.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(dec(enc(x)).float(), x)
        if i == 2:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.unscale_(opt_enc)
        torch.nn.utils.clip_grad_norm_(enc.parameters(), 0.5)
        scaler.step(opt_enc)
        scaler.step(opt_dec)
        scaler.update()
        sched.step()
        print(f"step {i} loss {loss.item()!r} scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
