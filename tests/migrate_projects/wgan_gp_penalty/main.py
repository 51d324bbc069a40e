"""Shape: a WGAN-GP trainer with the gradient penalty under AMP (held-out round).

The critic steps ``n_critic`` times per generator step. Its gradient penalty follows the
recipe of torch's AMP examples: the critic's outputs on interpolated samples are scaled
with ``scaler_d.scale(...)`` before ``torch.autograd.grad(..., create_graph=True)``, the
gradients are unscaled by hand with ``1 / scaler_d.get_scale()``, and the penalty is
computed under autocast and added to the Wasserstein loss before
``scaler_d.scale(loss_d).backward()``. Each network has its own scaler, stepped and updated
once per its own step; the generator steps through the critic, whose gradients its own
``zero_grad`` clears. Hard: a second, scaled differentiation between the forward and the
backward, reading the scale on the main thread.
"""

import torch
import torch.nn as nn


def gradient_penalty(critic, real, fake, scaler, gen):
    alpha = torch.rand(real.shape[0], 1, generator=gen)
    interpolated = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = critic(interpolated)
    scaled = torch.autograd.grad(outputs=scaler.scale(scores.float().sum()), inputs=interpolated, create_graph=True)[0]
    grads = scaled * (1.0 / scaler.get_scale())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return ((grads.norm(2, dim=1) - 1) ** 2).mean()


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6))
    netD = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.9))
    opt_d = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.9))
    scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=2)
    scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=3)
    n_critic, lambda_gp = 2, 10.0
    for it in range(5):
        for _ in range(n_critic):
            real = torch.randn(8, 6, generator=gen) + 2.0
            noise = torch.randn(8, 4, generator=gen)
            opt_d.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                fake = netG(noise).detach()
                wasserstein = netD(fake).mean() - netD(real).mean()
            penalty = gradient_penalty(netD, real, fake.float(), scaler_d, gen)
            loss_d = wasserstein + lambda_gp * penalty
            scaler_d.scale(loss_d).backward()
            scaler_d.step(opt_d)
            scaler_d.update()

        opt_g.zero_grad()
        noise = torch.randn(8, 4, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_g = -netD(netG(noise)).mean()
        scaler_g.scale(loss_g).backward()
        scaler_g.step(opt_g)
        scaler_g.update()
        print(f"step {it} loss {loss_g.item()!r} loss_d {loss_d.item()!r} gp {penalty.item()!r}")
    print(f"final scale {scaler_g.get_scale()!r} {scaler_d.get_scale()!r}")


if __name__ == "__main__":
    main()
