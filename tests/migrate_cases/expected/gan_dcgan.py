import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

NZ = 4


def main():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(NZ, 16), nn.BatchNorm1d(16), nn.ReLU(True), nn.Linear(16, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 1))
    criterion = nn.BCEWithLogitsLoss()
    netD = roundpipe.RoundPipe(netD, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizerD = torch.optim.Adam(netD.optim_parameters(), lr=2e-3, betas=(0.5, 0.999))
    netG = roundpipe.RoundPipe(netG, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizerG = torch.optim.Adam(netG.optim_parameters(), lr=2e-3, betas=(0.5, 0.999))
    scaler = roundpipe.GradScaler(init_scale=1024.0, growth_interval=3)
    gen = torch.Generator().manual_seed(7)
    real_label, fake_label = 1.0, 0.0
    for i in range(8):
        real_cpu = torch.rand(12, 8, generator=gen) * 2 - 1
        # (1) Update D network
        netD.zero_grad()
        label = torch.full((12,), real_label)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = netD(real_cpu).view(-1)
            errD_real = criterion(output.float(), label)
        scaler.scale(errD_real).backward()
        D_x = output.float().mean().item()
        noise = torch.randn(12, NZ, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach()).view(-1)
            errD_fake = criterion(output.float(), label)
        scaler.scale(errD_fake).backward(retain_graph=True)
        D_G_z1 = output.float().mean().item()
        errD = errD_real + errD_fake

        def _step_fn():
            scaler.step(optimizerD)
            optimizerD.zero_grad()

        netD.step(_step_fn)
        # (2) Update G network
        netG.zero_grad()
        label.fill_(real_label)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = netD(fake).view(-1)
            errG = criterion(output.float(), label)
        scaler.scale(errG).backward()
        D_G_z2 = output.float().mean().item()

        def _step_fn_2():
            scaler.step(optimizerG)
            optimizerG.zero_grad()

        netG.step(_step_fn_2)
        scaler.update()
        print(f"step {i} loss {errD.item()!r} {errG.item()!r} {D_x!r} {D_G_z1!r} {D_G_z2!r}")


if __name__ == "__main__":
    main()
