import roundpipe
import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

NZ = 4


def make_networks():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(NZ, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return netG, netD


def train(netG, netD, steps):
    netG = roundpipe.RoundPipe(netG, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    opt_g = torch.optim.Adam(netG.optim_parameters(), lr=1e-3, betas=(0.0, 0.9))
    netD = roundpipe.RoundPipe(netD, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    opt_d = torch.optim.Adam(netD.optim_parameters(), lr=4e-3, betas=(0.0, 0.9))
    scaler_g = roundpipe.GradScaler(init_scale=2.0**6, growth_interval=2)
    scaler_d = roundpipe.GradScaler(init_scale=2.0**12, growth_interval=3)
    gen = torch.Generator().manual_seed(20)
    for i in range(steps):
        real = torch.rand(16, 8, generator=gen) * 2 - 1
        z = torch.randn(16, NZ, generator=gen)
        netD.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = netG(z).detach()
            loss_d = F.relu(1.0 - netD(real)).mean() + F.relu(1.0 + netD(fake)).mean()
        scaler_d.scale(loss_d).backward()

        def _step_fn_2():
            scaler_d.unscale_(opt_d)
            nn.utils.clip_grad_norm_(netD.optim_parameters(), 0.5)
            scaler_d.step(opt_d)
            opt_d.zero_grad(set_to_none=True)

        netD.step(_step_fn_2)
        scaler_d.update()
        netG.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_g = -netD(netG(z)).float().mean()
        scaler_g.scale(loss_g).backward()

        def _step_fn():
            scaler_g.step(opt_g)
            opt_g.zero_grad(set_to_none=True)

        netG.step(_step_fn)
        scaler_g.update()
        print(f"step {i} loss {loss_d.item()!r} lossG {loss_g.item()!r}")
    print(f"final scale {scaler_d.get_scale()!r} {scaler_g.get_scale()!r}")


if __name__ == "__main__":
    train(*make_networks(), steps=8)
