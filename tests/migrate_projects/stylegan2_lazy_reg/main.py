"""Shape: a StyleGAN2-style trainer with lazy R1 regularization (held-out round).

``train`` alternates a discriminator step (non-saturating logistic loss on real and detached
fake images) and a generator step; every ``d_reg_every`` iterations a second discriminator
pass computes the R1 penalty through ``autograd.grad(..., create_graph=True)`` on real images
that require grad, outside autocast, and runs a second scaled backward and a second step of
the same optimizer. Both Adam optimizers have lr and betas rescaled by the lazy
regularization ratio; ``requires_grad`` is switched per network around each step; one
GradScaler is shared and updated after every step; ``accumulate`` keeps a ``g_ema`` copy
after each iteration. Hard: a second backward and step of one optimizer inside one
iteration on some iterations only, and a double backward through the discriminator.
"""

import argparse
import copy
import io

import torch
import torch.nn.functional as F
from torch import autograd, optim

from model import Discriminator, Generator


def requires_grad(model, flag=True):
    for p in model.parameters():
        p.requires_grad = flag


def accumulate(model1, model2, decay=0.999):
    par1 = dict(model1.named_parameters())
    par2 = dict(model2.named_parameters())
    for k in par1.keys():
        par1[k].data.mul_(decay).add_(par2[k].data, alpha=1 - decay)


def d_logistic_loss(real_pred, fake_pred):
    return F.softplus(-real_pred).mean() + F.softplus(fake_pred).mean()


def d_r1_loss(real_pred, real_img):
    (grad_real,) = autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)
    return grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()


def g_nonsaturating_loss(fake_pred):
    return F.softplus(-fake_pred).mean()


def make_noise(batch, style_dim, gen):
    return [torch.randn(batch, style_dim, generator=gen)]


def train(args, loader, generator, discriminator, g_optim, d_optim, g_ema, scaler):
    gen = torch.Generator().manual_seed(3)
    r1_loss = torch.tensor(0.0)
    accum = 0.5 ** (32 / (10 * 1000))
    for idx, real_img in enumerate(loader):
        i = idx + args.start_iter

        requires_grad(generator, False)
        requires_grad(discriminator, True)
        noise = make_noise(args.batch, args.latent, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake_img, _ = generator(noise)
            fake_pred = discriminator(fake_img.detach())
            real_pred = discriminator(real_img)
            d_loss = d_logistic_loss(real_pred.float(), fake_pred.float())
        discriminator.zero_grad()
        scaler.scale(d_loss).backward()
        scaler.step(d_optim)
        scaler.update()

        d_regularize = i % args.d_reg_every == 0
        if d_regularize:
            real_img.requires_grad = True
            real_pred = discriminator(real_img)
            r1_loss = d_r1_loss(real_pred, real_img)
            discriminator.zero_grad()
            scaler.scale(args.r1 / 2 * r1_loss * args.d_reg_every + 0 * real_pred[0]).backward()
            scaler.step(d_optim)
            scaler.update()

        requires_grad(generator, True)
        requires_grad(discriminator, False)
        noise = make_noise(args.batch, args.latent, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake_img, _ = generator(noise)
            fake_pred = discriminator(fake_img)
            g_loss = g_nonsaturating_loss(fake_pred.float())
        generator.zero_grad()
        scaler.scale(g_loss).backward()
        scaler.step(g_optim)
        scaler.update()

        accumulate(g_ema, generator, accum)
        print(f"step {i} d {d_loss.item()!r} g {g_loss.item()!r} r1 {r1_loss.item()!r}")

    buffer = io.BytesIO()
    torch.save(
        {
            "g": generator.state_dict(),
            "d": discriminator.state_dict(),
            "g_ema": g_ema.state_dict(),
            "g_optim": g_optim.state_dict(),
            "d_optim": d_optim.state_dict(),
            "scaler": scaler.state_dict(),
            "args": vars(args),
        },
        buffer,
    )
    ema_norm = sum(p.norm().item() for p in g_ema.parameters())
    print(f"g_ema norm {ema_norm!r}")
    print(f"final scale {scaler.get_scale()!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iter", type=int, default=7)
    parser.add_argument("--batch", type=int, default=6)
    parser.add_argument("--latent", type=int, default=8)
    parser.add_argument("--r1", type=float, default=10.0)
    parser.add_argument("--d-reg-every", type=int, default=3)
    parser.add_argument("--g-reg-every", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--start-iter", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = Generator(args.latent)
    discriminator = Discriminator()
    g_ema = copy.deepcopy(generator)
    g_ema.eval()
    accumulate(g_ema, generator, 0)

    g_reg_ratio = args.g_reg_every / (args.g_reg_every + 1)
    d_reg_ratio = args.d_reg_every / (args.d_reg_every + 1)
    g_optim = optim.Adam(generator.parameters(), lr=args.lr * g_reg_ratio, betas=(0**g_reg_ratio, 0.99**g_reg_ratio))
    d_optim = optim.Adam(
        discriminator.parameters(), lr=args.lr * d_reg_ratio, betas=(0**d_reg_ratio, 0.99**d_reg_ratio)
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)

    data = torch.Generator().manual_seed(11)
    loader = [torch.randn(args.batch, 1, 4, 4, generator=data).tanh() for _ in range(args.iter)]
    train(args, loader, generator, discriminator, g_optim, d_optim, g_ema, scaler)


if __name__ == "__main__":
    main()
