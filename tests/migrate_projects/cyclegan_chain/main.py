"""Shape: a CycleGAN-style trainer (issue 10, shape 11).

Two generators share one optimizer built on ``itertools.chain(netG_A.parameters(),
netG_B.parameters())``, two discriminators share another; ``set_requires_grad`` switches the
discriminators off for the generator step and on again for theirs; one ``GradScaler``
scales the generator loss (identity, GAN and cycle terms) and the discriminator loss and is
updated once per iteration; an image pool (``fake_pool``) hands the discriminator detached
fakes. Hard: an optimizer over the parameters of two models, and ``requires_grad`` toggled
between the two steps.
"""

import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F


def small_net(out_act=None):
    layers = [nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6)]
    if out_act is not None:
        layers.append(out_act)
    return nn.Sequential(*layers)


def set_requires_grad(nets, requires_grad=False):
    for net in nets:
        for param in net.parameters():
            param.requires_grad = requires_grad


class ImagePool:
    """Keeps the last fakes; here simply returns the current ones (pool size 0)."""

    def query(self, images):
        return images


def main():
    torch.manual_seed(3)
    netG_A, netG_B = small_net(nn.Tanh()), small_net(nn.Tanh())
    netD_A, netD_B = small_net(), small_net()
    optimizer_G = torch.optim.Adam(
        itertools.chain(netG_A.parameters(), netG_B.parameters()), lr=2e-3, betas=(0.5, 0.999)
    )
    optimizer_D = torch.optim.Adam(
        itertools.chain(netD_A.parameters(), netD_B.parameters()), lr=2e-3, betas=(0.5, 0.999)
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    fake_A_pool, fake_B_pool = ImagePool(), ImagePool()
    gen = torch.Generator().manual_seed(4)
    lambda_A, lambda_B, lambda_idt = 10.0, 10.0, 0.5
    for it in range(5):
        real_A, real_B = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen) + 1.0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake_B = netG_A(real_A)
            rec_A = netG_B(fake_B)
            fake_A = netG_B(real_B)
            rec_B = netG_A(fake_A)

        # G_A and G_B
        set_requires_grad([netD_A, netD_B], False)
        optimizer_G.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_idt_A = F.l1_loss(netG_A(real_B), real_B) * lambda_B * lambda_idt
            loss_idt_B = F.l1_loss(netG_B(real_A), real_A) * lambda_A * lambda_idt
            loss_G_A = F.mse_loss(netD_A(fake_B).float(), torch.ones(4, 6))
            loss_G_B = F.mse_loss(netD_B(fake_A).float(), torch.ones(4, 6))
            loss_cycle_A = F.l1_loss(rec_A, real_A) * lambda_A
            loss_cycle_B = F.l1_loss(rec_B, real_B) * lambda_B
            loss_G = loss_G_A + loss_G_B + loss_cycle_A + loss_cycle_B + loss_idt_A + loss_idt_B
        scaler.scale(loss_G).backward()
        scaler.step(optimizer_G)

        # D_A and D_B
        set_requires_grad([netD_A, netD_B], True)
        optimizer_D.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fb = fake_B_pool.query(fake_B)
            fa = fake_A_pool.query(fake_A)
            loss_D_A = 0.5 * (
                F.mse_loss(netD_A(real_B).float(), torch.ones(4, 6))
                + F.mse_loss(netD_A(fb.detach()).float(), torch.zeros(4, 6))
            )
            loss_D_B = 0.5 * (
                F.mse_loss(netD_B(real_A).float(), torch.ones(4, 6))
                + F.mse_loss(netD_B(fa.detach()).float(), torch.zeros(4, 6))
            )
            loss_D = loss_D_A + loss_D_B
        scaler.scale(loss_D).backward()
        scaler.step(optimizer_D)
        scaler.update()
        print(f"step {it} loss_G {loss_G.item()!r} loss_D {loss_D.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
