"""Shape: a GAN trainer class with one scaler per network (issue 10, shape 11).

``GANTrainer`` holds generator, discriminator, their optimizers and two scalers
(``scaler_g``/``scaler_d``) on ``self``; ``d_step`` and ``g_step`` are separate methods with
a hinge loss and gradient clipping on the discriminator only; both scalers are saved in
``state_dict``. Hard: two independent scale sequences, one update each per iteration, and
the generator's backward reaches the discriminator's parameters.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GANTrainer:
    def __init__(self, z_dim=3):
        self.z_dim = z_dim
        self.G = nn.Sequential(nn.Linear(z_dim, 12), nn.ReLU(), nn.Linear(12, 2))
        self.D = nn.Sequential(nn.Linear(2, 12), nn.LeakyReLU(0.1), nn.Linear(12, 1))
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=1e-3, betas=(0.0, 0.9))
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=4e-3, betas=(0.0, 0.9))
        self.scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=2)
        self.scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=5)

    def d_step(self, real, z):
        self.opt_d.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = self.G(z).detach()
            loss_d = F.relu(1.0 - self.D(real)).mean() + F.relu(1.0 + self.D(fake)).mean()
        self.scaler_d.scale(loss_d).backward()
        self.scaler_d.unscale_(self.opt_d)
        nn.utils.clip_grad_norm_(self.D.parameters(), 1.0)
        self.scaler_d.step(self.opt_d)
        self.scaler_d.update()
        return loss_d.item()

    def g_step(self, z):
        self.opt_g.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_g = -self.D(self.G(z)).float().mean()
        self.scaler_g.scale(loss_g).backward()
        self.scaler_g.step(self.opt_g)
        self.scaler_g.update()
        return loss_g.item()

    def state_dict(self):
        return {
            "G": self.G.state_dict(), "D": self.D.state_dict(),
            "scaler_g": self.scaler_g.state_dict(), "scaler_d": self.scaler_d.state_dict(),
        }


def main():
    torch.manual_seed(0)
    trainer = GANTrainer()
    gen = torch.Generator().manual_seed(20)
    for step in range(8):
        real = torch.randn(16, 2, generator=gen) * 0.5 + torch.tensor([1.0, -1.0])
        loss_d = trainer.d_step(real, torch.randn(16, trainer.z_dim, generator=gen))
        loss_g = trainer.g_step(torch.randn(16, trainer.z_dim, generator=gen))
        print(f"step {step} loss {loss_d!r} loss_g {loss_g!r}")
    state = trainer.state_dict()
    print(f"final scale {state['scaler_d']['scale']!r} {state['scaler_g']['scale']!r}")


if __name__ == "__main__":
    main()
