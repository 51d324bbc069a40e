"""GANs and several optimizers (issue 10, shape 11): the rewrite and what it computes.

Each program trains a discriminator and a generator on CPU under bf16 autocast, with one
scaler shared by both steps or one scaler each, and prints every loss and scale. The
``--exact`` migration must print exactly the original's numbers (two RoundPipe models, each
with its own ``model.step``; the shared scale updated once per iteration), the default
(asynchronous) migration as many steps; a near-miss stays refused with its reason.
"""

from __future__ import annotations

import re

import pytest

from migrate import multi_step
from migrate.engine import migrate_source
from script_runs import run_script

STEP = re.compile(r"^step \d+ ", re.M)

_NETWORKS = """import torch
import torch.nn as nn
import torch.nn.functional as F

NZ = 4


def make_networks():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(NZ, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return netG, netD
"""

# DCGAN-style, one scaler: the discriminator's gradients are zeroed through its optimizer at
# the top, so what the generator's backward leaves in them is dropped only there; an inf
# loss in iteration 3 skips the discriminator's step alone and backs the shared scale off.
SHARED_SCALER = (
    _NETWORKS
    + """

def train(netG, netD, steps):
    criterion = nn.BCEWithLogitsLoss()
    opt_d = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    gen = torch.Generator().manual_seed(7)
    for i in range(steps):
        real = torch.rand(12, 8, generator=gen) * 2 - 1
        noise = torch.randn(12, NZ, generator=gen)
        opt_d.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = netG(noise)
            loss_d = criterion(netD(real).float().view(-1), torch.ones(12))
            loss_d = loss_d + criterion(netD(fake.detach()).float().view(-1), torch.zeros(12))
        if i == 3:
            loss_d = loss_d * float("inf")
        scaler.scale(loss_d).backward()
        scaler.step(opt_d)
        opt_g.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_g = criterion(netD(fake).float().view(-1), torch.ones(12))
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)
        scaler.update()
        print(f"step {i} loss {loss_d.item()!r} lossG {loss_g.item()!r} scale {scaler.get_scale()!r}")
    print(f"final {[p.sum().item() for p in netD.parameters()]!r}")


if __name__ == "__main__":
    train(*make_networks(), steps=8)
"""
)

# One scaler each, hinge loss, the discriminator clipped after unscale_, both updated.
TWO_SCALERS = (
    _NETWORKS
    + """

def train(netG, netD, steps):
    opt_g = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(netD.parameters(), lr=4e-3, betas=(0.0, 0.9))
    scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=2)
    scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=3)
    gen = torch.Generator().manual_seed(20)
    for i in range(steps):
        real = torch.rand(16, 8, generator=gen) * 2 - 1
        z = torch.randn(16, NZ, generator=gen)
        netD.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = netG(z).detach()
            loss_d = F.relu(1.0 - netD(real)).mean() + F.relu(1.0 + netD(fake)).mean()
        scaler_d.scale(loss_d).backward()
        scaler_d.unscale_(opt_d)
        nn.utils.clip_grad_norm_(netD.parameters(), 0.5)
        scaler_d.step(opt_d)
        scaler_d.update()
        netG.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_g = -netD(netG(z)).float().mean()
        scaler_g.scale(loss_g).backward()
        scaler_g.step(opt_g)
        scaler_g.update()
        print(f"step {i} loss {loss_d.item()!r} lossG {loss_g.item()!r}")
    print(f"final scale {scaler_d.get_scale()!r} {scaler_g.get_scale()!r}")


if __name__ == "__main__":
    train(*make_networks(), steps=8)
"""
)

# WGAN-style: each network's step in its own helper (scaler, models and optimizer passed in),
# three critic steps per generator step, one scaler each.
HELPER_STEPS = """import torch
import torch.nn as nn

NZ = 3


def train_d(netD, netG, opt_d, scaler, real, z, clip):
    opt_d.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_d = netD(netG(z).detach()).float().mean() - netD(real).float().mean()
    scaler.scale(loss_d).backward()
    scaler.unscale_(opt_d)
    nn.utils.clip_grad_norm_(netD.parameters(), clip)
    scaler.step(opt_d)
    scaler.update()
    return loss_d.item()


def train_g(netD, netG, opt_g, scaler, z):
    opt_g.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_g = -netD(netG(z)).float().mean()
    scaler.scale(loss_g).backward()
    scaler.step(opt_g)
    scaler.update()
    return loss_g.item()


def main():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(NZ, 12), nn.ReLU(), nn.Linear(12, 2))
    netD = nn.Sequential(nn.Linear(2, 12), nn.LeakyReLU(0.1), nn.Linear(12, 1))
    opt_d = torch.optim.RMSprop(netD.parameters(), lr=5e-3)
    opt_g = torch.optim.RMSprop(netG.parameters(), lr=5e-3)
    scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=3)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        for _ in range(3):
            real = torch.randn(16, 2, generator=gen) + 1.0
            loss_d = train_d(netD, netG, opt_d, scaler_d, real, torch.randn(16, NZ, generator=gen), 0.1)
        loss_g = train_g(netD, netG, opt_g, scaler_g, torch.randn(16, NZ, generator=gen))
        print(f"step {step} loss {loss_d!r} {loss_g!r}")
    print(scaler_d.get_scale(), scaler_g.get_scale())


if __name__ == "__main__":
    main()
"""

# pix2pix-style: the discriminator frozen with set_requires_grad() for the generator's
# backward, one shared scaler updated after the generator's step.
REQUIRES_GRAD_TOGGLES = """import torch
import torch.nn as nn


def set_requires_grad(nets, requires_grad=False):
    if not isinstance(nets, list):
        nets = [nets]
    for net in nets:
        if net is not None:
            for param in net.parameters():
                param.requires_grad = requires_grad


def main():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 6))
    netD = nn.Sequential(nn.Linear(12, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    gan_loss = nn.MSELoss()
    l1 = nn.L1Loss()
    optimizer_G = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizer_D = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    gen = torch.Generator().manual_seed(3)
    for i in range(6):
        real_A = torch.randn(8, 6, generator=gen)
        real_B = torch.randn(8, 6, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake_B = netG(real_A)
        # update D
        set_requires_grad(netD, True)
        optimizer_D.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred_fake = netD(torch.cat((real_A, fake_B), 1).detach())
            loss_D_fake = gan_loss(pred_fake.float(), torch.zeros_like(pred_fake.float()))
            pred_real = netD(torch.cat((real_A, real_B), 1))
            loss_D_real = gan_loss(pred_real.float(), torch.ones_like(pred_real.float()))
            loss_D = (loss_D_fake + loss_D_real) * 0.5
        scaler.scale(loss_D).backward()
        scaler.step(optimizer_D)
        # update G
        set_requires_grad(netD, False)
        optimizer_G.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred_fake = netD(torch.cat((real_A, fake_B), 1))
            loss_G = gan_loss(pred_fake.float(), torch.ones_like(pred_fake.float())) + l1(fake_B.float(), real_B) * 10
        scaler.scale(loss_G).backward()
        scaler.step(optimizer_G)
        scaler.update()
        print(f"step {i} loss {loss_D.item()!r} {loss_G.item()!r}")


if __name__ == "__main__":
    main()
"""

# One scheduler per optimizer, stepped after both steps (outside either step function).
SCHEDULERS = """import torch
import torch.nn as nn

NZ = 4


def main():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(NZ, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    schedD = torch.optim.lr_scheduler.StepLR(optimizerD, 2, 0.5)
    schedG = torch.optim.lr_scheduler.StepLR(optimizerG, 3, 0.5)
    gen = torch.Generator().manual_seed(7)
    for i in range(8):
        real = torch.rand(12, 8, generator=gen) * 2 - 1
        noise = torch.randn(12, NZ, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = netG(noise)
            errD = criterion(netD(real).view(-1).float(), torch.ones(12))
            errD = errD + criterion(netD(fake.detach()).view(-1).float(), torch.zeros(12))
        scaler.scale(errD).backward()
        scaler.unscale_(optimizerD)
        torch.nn.utils.clip_grad_norm_(netD.parameters(), 0.5)
        scaler.step(optimizerD)
        optimizerD.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            errG = criterion(netD(fake).view(-1).float(), torch.ones(12))
        scaler.scale(errG).backward()
        scaler.step(optimizerG)
        scaler.update()
        schedD.step()
        schedG.step()
        optimizerG.zero_grad()
        print(f"step {i} loss {errD.item()!r} lossG {errG.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
"""

# pytorch/examples' DCGAN with AMP: the discriminator's backward in two parts (real, then
# fakes, the latter keeping its graph), one step after both; BatchNorm in the generator.
TWO_BACKWARDS_ONE_STEP = """import torch
import torch.nn as nn

NZ = 4


def main():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(NZ, 16), nn.BatchNorm1d(16), nn.ReLU(True), nn.Linear(16, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 1))
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
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
        scaler.step(optimizerD)
        # (2) Update G network
        netG.zero_grad()
        label.fill_(real_label)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = netD(fake).view(-1)
            errG = criterion(output.float(), label)
        scaler.scale(errG).backward()
        D_G_z2 = output.float().mean().item()
        scaler.step(optimizerG)
        scaler.update()
        print(f"step {i} loss {errD.item()!r} {errG.item()!r} {D_x!r} {D_G_z1!r} {D_G_z2!r}")


if __name__ == "__main__":
    main()
"""

# One loss through an encoder and a decoder, each with its own optimizer, both stepped
# after the one backward (the encoder clipped); a scheduler on the decoder's optimizer.
ONE_LOSS_TWO_NETWORKS = """import torch
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
"""

# A trainer class with one scaler per network and a step method each (the `self.` variant):
# the discriminator's step calls the generator with `.detach()`, the generator's step runs
# through the discriminator, whose zero_grad() before its own backward drops what that left;
# an inf batch in iteration 2 skips the discriminator's step alone.
TRAINER_TWO_SCALERS = """import torch
import torch.nn as nn
import torch.nn.functional as F


class GANTrainer:
    def __init__(self, z_dim=3):
        torch.manual_seed(0)
        self.z_dim = z_dim
        self.G = nn.Sequential(nn.Linear(z_dim, 12), nn.ReLU(), nn.Linear(12, 2))
        self.D = nn.Sequential(nn.Linear(2, 12), nn.LeakyReLU(0.1), nn.Linear(12, 1))
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=1e-3, betas=(0.0, 0.9))
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=4e-3, betas=(0.0, 0.9))
        self.scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=2)
        self.scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=3)

    def d_step(self, real, z):
        self.opt_d.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = self.G(z).detach()
            loss_d = F.relu(1.0 - self.D(real)).mean() + F.relu(1.0 + self.D(fake)).mean()
        self.scaler_d.scale(loss_d).backward()
        self.scaler_d.unscale_(self.opt_d)
        nn.utils.clip_grad_norm_(self.D.parameters(), 0.5)
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


def main():
    trainer = GANTrainer()
    gen = torch.Generator().manual_seed(20)
    for step in range(8):
        real = torch.randn(16, 2, generator=gen) * 0.5 + 1.0
        if step == 2:
            real[0, 0] = float("inf")
        loss_d = trainer.d_step(real, torch.randn(16, trainer.z_dim, generator=gen))
        loss_g = trainer.g_step(torch.randn(16, trainer.z_dim, generator=gen))
        print(f"step {step} loss {loss_d!r} lossG {loss_g!r}")
    print(f"final scale {trainer.scaler_d.get_scale()!r} {trainer.scaler_g.get_scale()!r}")


if __name__ == "__main__":
    main()
"""

PROGRAMS = {
    "one_loss_two_networks": ONE_LOSS_TWO_NETWORKS,
    "two_backwards_one_step": TWO_BACKWARDS_ONE_STEP,
    "shared_scaler": SHARED_SCALER,
    "two_scalers": TWO_SCALERS,
    "helper_steps": HELPER_STEPS,
    "requires_grad_toggles": REQUIRES_GRAD_TOGGLES,
    "schedulers": SCHEDULERS,
    "trainer_two_scalers": TRAINER_TWO_SCALERS,
}


def test_shared_scaler_gets_one_step_function_per_network_and_one_update():
    result = migrate_source(SHARED_SCALER, "gan.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    text = result.migrated
    assert "netD = roundpipe.RoundPipe(netD" in text and "netG = roundpipe.RoundPipe(netG" in text
    assert "torch.optim.Adam(netD.optim_parameters()" in text and "torch.optim.Adam(netG.optim_parameters()" in text
    # zero_grad() stays in place, on the model; the step function zeroes the copies
    assert "        netD.zero_grad()\n        with torch.autocast" in text
    assert "        netG.zero_grad()\n        with torch.autocast" in text
    assert (
        "            scaler.step(opt_d)\n            opt_d.zero_grad()\n\n        netD.step(_step_fn, is_async=False)\n"
        in text
    )
    assert "            scaler.step(opt_g)\n            opt_g.zero_grad()\n" in text
    assert text.count("scaler.update()") == 1
    assert text.index("netG.step(") < text.index("scaler.update()")
    forms = [r.description for r in result.rewrites if "autograd form" in r.description]
    assert len(forms) == 2 and all("another backward" in form for form in forms)
    assert migrate_source(text, "gan.py", exact=True).migrated == text  # idempotent


def _cases(fast):
    """Every program, the ones not in ``fast`` marked slow."""
    return [pytest.param(name, marks=() if name in fast else pytest.mark.slow) for name in sorted(PROGRAMS)]


FAST_EXACT = {"shared_scaler", "two_scalers", "one_loss_two_networks", "two_backwards_one_step", "trainer_two_scalers"}
FAST_DEFAULT = {"shared_scaler", "two_scalers"}


@pytest.mark.parametrize("name", _cases(FAST_EXACT))
def test_exact_migration_prints_the_originals_numbers(name, tmp_path):
    source = PROGRAMS[name]
    original = run_script(source, tmp_path, "original.py")
    assert len(STEP.findall(original)) >= 6
    exact = migrate_source(source, f"{name}.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert run_script(exact.migrated, tmp_path, "exact.py") == original


def test_shared_scale_backs_off_once_for_the_skipped_discriminator_step(tmp_path):
    """The inf loss of iteration 3 skips the discriminator's step only; the one update
    combines both optimizers' inf checks (the scale halves once, as with torch)."""
    exact = migrate_source(SHARED_SCALER, "gan.py", exact=True).migrated
    scales = [float(s) for s in re.findall(r" scale (\S+)$", run_script(exact, tmp_path, "exact.py"), re.M)]
    assert scales[2] * 0.5 == scales[3] == scales[4] < scales[5]


@pytest.mark.parametrize("name", _cases(FAST_DEFAULT))
def test_default_migration_runs_as_many_steps(name, tmp_path):
    source = PROGRAMS[name]
    default = migrate_source(source, f"{name}.py")
    assert default.status == "migrated"
    assert "is_async=False" not in default.migrated
    printed = run_script(default.migrated, tmp_path, "default.py")
    assert len(STEP.findall(printed)) == len(STEP.findall(run_script(source, tmp_path, "original.py")))


def test_keeping_zero_grad_in_place_is_what_keeps_the_numbers(tmp_path, monkeypatch):
    """Moving the top-of-iteration zero_grad() into the step function (the single-network
    rule) would hand the gradients the generator's backward left in the discriminator to its
    next step: the numbers would change. The test above would notice."""
    original = run_script(SHARED_SCALER, tmp_path, "original.py")
    monkeypatch.setattr(multi_step, "keeps_zero_grad_in_place", lambda step: False)
    moved = migrate_source(SHARED_SCALER, "gan.py", exact=True)
    assert "        netD.zero_grad()\n" not in moved.migrated
    assert run_script(moved.migrated, tmp_path, "moved.py") != original


def test_an_optimizer_over_two_networks_is_refused_by_name():
    source = SHARED_SCALER.replace(
        "opt_g = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))",
        "opt_g = torch.optim.Adam([*netG.parameters(), *netD.parameters()], lr=2e-3)",
    )
    result = migrate_source(source, "gan.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM108"]
    assert "several models (netD and netG)" in result.diagnostics[0].message


def test_a_shared_scaler_without_an_update_after_the_first_step_is_refused():
    source = SHARED_SCALER.replace("        scaler.update()\n", "")
    result = migrate_source(source, "gan.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM107", "RPM107"]
    assert all("is not followed by `scaler.update()`" in d.message for d in result.diagnostics)


def test_a_step_that_zeroes_the_other_network_keeps_that_on_the_main_thread():
    """`scaler.step(opt_d)` directly followed by `netG.zero_grad()`: the zeroing is the
    generator's (main-thread gradients), so it stays out of the discriminator's step."""
    source = SHARED_SCALER.replace("        opt_g.zero_grad()\n", "        netG.zero_grad()\n")
    text = migrate_source(source, "gan.py", exact=True).migrated
    assert "            scaler.step(opt_d)\n            opt_d.zero_grad()\n\n        netD.step(" in text
    assert "netD.step(_step_fn, is_async=False)\n        netG.zero_grad()\n" in text


def test_each_scheduler_waits_for_its_own_networks_step():
    """In the asynchronous form a scheduler left on the main thread waits for the step of
    the network whose optimizer it drives (not for the other network's)."""
    text = migrate_source(SCHEDULERS, "gan.py").migrated
    assert (
        "        netD.synchronize()\n        schedD.step()\n        netG.synchronize()\n        schedG.step()\n" in text
    )


def test_both_steps_after_the_generators_backward_get_a_step_function_each(tmp_path):
    """The discriminator's backward feeds the step after the generator's: both optimizers
    are stepped there, each on its own network's ``model.step``."""
    source = SHARED_SCALER.replace("        scaler.step(opt_d)\n", "").replace(
        "        scaler.step(opt_g)\n", "        scaler.step(opt_g)\n        scaler.step(opt_d)\n"
    )
    result = migrate_source(source, "gan.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert "            scaler.step(opt_g)\n            opt_g.zero_grad()\n\n        netG.step(" in result.migrated
    assert "            scaler.step(opt_d)\n            opt_d.zero_grad()\n\n        netD.step(" in result.migrated
    assert run_script(result.migrated, tmp_path, "exact.py") == run_script(source, tmp_path, "original.py")


def test_clipping_over_both_networks_after_one_backward_is_refused():
    source = ONE_LOSS_TWO_NETWORKS.replace(
        "        torch.nn.utils.clip_grad_norm_(enc.parameters(), 0.5)\n",
        "        scaler.unscale_(opt_dec)\n"
        "        torch.nn.utils.clip_grad_norm_([*enc.parameters(), *dec.parameters()], 0.5)\n",
    )
    result = migrate_source(source, "ae.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM107"]
    assert "cannot be given to exactly one of the optimizers opt_enc, opt_dec" in result.diagnostics[0].message


def test_a_backward_feeding_the_next_ones_step_stays_as_written():
    text = migrate_source(TWO_BACKWARDS_ONE_STEP, "dcgan.py", exact=True).migrated
    assert "        scaler.scale(errD_real).backward()\n        D_x = output.float().mean().item()\n" in text
    assert "        scaler.scale(errD_fake).backward(retain_graph=True)\n" in text
    assert "            scaler.step(optimizerD)\n            optimizerD.zero_grad()\n\n        netD.step(" in text
    assert text.count(".step(_step_fn") == 2


def test_default_migration_applies_each_iterations_inf_checks_one_iteration_late(tmp_path):
    """Asynchronous steps: each update() waits for the previous iteration's two steps and
    applies their combined inf checks (upstream RoundPipe's one-iteration lag), so the
    printed scales are the original's, one iteration late; the skipped discriminator step
    of iteration 3 backs the scale off once, in iteration 4."""
    scale = re.compile(r" scale (\S+)$", re.M)
    original = [float(s) for s in scale.findall(run_script(SHARED_SCALER, tmp_path, "original.py"))]
    default = migrate_source(SHARED_SCALER, "gan.py").migrated
    lagged = [float(s) for s in scale.findall(run_script(default, tmp_path, "default.py"))]
    assert lagged == [1024.0] + original[:-1]


def test_trainer_class_steps_each_network_in_its_own_method():
    result = migrate_source(TRAINER_TWO_SCALERS, "gan.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    text = result.migrated
    assert "        self.D.zero_grad()\n" in text and "        self.G.zero_grad()\n" in text
    assert "        self.D.step(_step_fn" in text and "        self.G.step(_step_fn" in text
    assert "            nn.utils.clip_grad_norm_(self.D.optim_parameters(), 0.5)\n" in text
    assert migrate_source(text, "gan.py", exact=True).migrated == text  # idempotent


def test_the_discriminator_step_may_call_the_generator_under_no_grad(tmp_path):
    source = TRAINER_TWO_SCALERS.replace(
        "            fake = self.G(z).detach()\n",
        "            with torch.no_grad():\n                fake = self.G(z)\n",
    )
    exact = migrate_source(source, "gan.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert run_script(exact.migrated, tmp_path, "exact.py") == run_script(source, tmp_path, "original.py")


@pytest.mark.parametrize(
    "change,call",
    [
        (  # the generator's gradients are zeroed after its step only: what d_step leaves is not dropped
            lambda s: (
                s.replace("            fake = self.G(z).detach()\n", "            fake = self.G(z)\n")
                .replace("        self.opt_g.zero_grad()\n", "")
                .replace(
                    "        self.scaler_g.update()\n",
                    "        self.scaler_g.update()\n        self.opt_g.zero_grad()\n",
                )
            ),
            "self.G(z)",
        ),
        (  # the discriminator's gradients are zeroed after its step only: what g_step leaves reaches it
            lambda s: s.replace("        self.opt_d.zero_grad()\n", "").replace(
                "        self.scaler_d.update()\n", "        self.scaler_d.update()\n        self.opt_d.zero_grad()\n"
            ),
            "self.D(self.G(z))",
        ),
    ],
    ids=["generator_reached_by_d_step", "discriminator_reached_by_g_step"],
)
def test_a_step_reaching_another_network_without_proof_is_refused(change, call):
    source = change(TRAINER_TWO_SCALERS)
    assert source != TRAINER_TWO_SCALERS
    result = migrate_source(source, "gan.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM107"]
    assert f"`{call}`" in result.diagnostics[0].message and "reach" in result.diagnostics[0].message
