"""Shape: a GAN with one scaler shared by both optimizers (issue 10, shape 11).

DCGAN-style: the discriminator steps on real and detached fake samples, then the generator
steps through the discriminator; one ``GradScaler`` scales both losses, steps both
optimizers and is updated once per iteration. Hard: two models and two optimizers in one
iteration, the generator's backward runs through the discriminator (whose grads are
cleared by ``netD.zero_grad()`` at the top), and the scale update happens once after both.
"""

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
    netG, netD = Generator(), Discriminator()
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
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
        scaler.step(optimizerD)
        # (2) maximise log(D(G(z)))
        netG.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = netD(fake)
            errG = criterion(output.float(), torch.full((12,), real_label))
        scaler.scale(errG).backward()
        scaler.step(optimizerG)
        scaler.update()
        print(f"step {i} loss {errD.item()!r} lossG {errG.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
