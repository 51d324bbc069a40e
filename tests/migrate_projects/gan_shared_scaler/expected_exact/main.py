"""Shape: a GAN with one scaler shared by both optimizers (issue 10, shape 11), migrated by
hand: the --exact target.

Autograd form, two wrapped models: each network is a ``RoundPipe`` with its optimizer on its
copies; each backward stays as written and each ``scaler.step`` moves into that network's
own step function (which also zeroes that optimizer's grads, as the module's
``zero_grad()`` did for the parameters it shared with it); the one ``update()`` stays after
both steps. ``netD.zero_grad()`` still drops the discriminator grads left by the
generator's backward.

Original docstring:

DCGAN-style: the discriminator steps on real and detached fake samples, then the generator
steps through the discriminator; one ``GradScaler`` scales both losses, steps both
optimizers and is updated once per iteration. Hard: two models and two optimizers in one
iteration, the generator's backward runs through the discriminator (whose grads are
cleared by ``netD.zero_grad()`` at the top), and the scale update happens once after both.
"""

import roundpipe
import torch
import torch.nn as nn

NZ = 4


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(NZ, 16), nn.BatchNorm1d(16), nn.ReLU(True), nn.Linear(16, 8), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 1))

    def forward(self, x):
        return self.main(x).view(-1)


def main():
    torch.manual_seed(0)
    netG, netD = roundpipe.RoundPipe(Generator()), roundpipe.RoundPipe(Discriminator())
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.optim_parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.optim_parameters(), lr=2e-3, betas=(0.5, 0.999))
    scaler = roundpipe.GradScaler(init_scale=1024.0, growth_interval=3)
    gen = torch.Generator().manual_seed(7)
    real_label, fake_label = 1.0, 0.0
    for i in range(8):
        real = torch.rand(12, 8, generator=gen) * 2 - 1
        noise = torch.randn(12, NZ, generator=gen)
        # (1) maximise log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = netD(real)
            errD_real = criterion(output.float(), torch.full((12,), real_label))
            fake = netG(noise)
            output = netD(fake.detach())
            errD_fake = criterion(output.float(), torch.full((12,), fake_label))
            errD = errD_real + errD_fake
        scaler.scale(errD).backward()

        def step_d():
            scaler.step(optimizerD)
            optimizerD.zero_grad()

        netD.step(step_d, is_async=False)
        # (2) maximise log(D(G(z)))
        netG.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = netD(fake)
            errG = criterion(output.float(), torch.full((12,), real_label))
        scaler.scale(errG).backward()

        def step_g():
            scaler.step(optimizerG)
            optimizerG.zero_grad()

        netG.step(step_g, is_async=False)
        scaler.update()
        print(f"step {i} loss {errD.item()!r} lossG {errG.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
