"""Shape: a denoising-diffusion trainer class without accelerate (held-out round).

``GaussianDiffusion`` wraps a tiny denoiser and computes its own training loss in
``forward`` (a random timestep, noise added by a fixed beta schedule, the predicted noise
against the true one). ``Trainer`` holds the diffusion model, an ``EMA`` helper (a deep copy
updated every ``update_every`` steps after ``update_after_step``), the optimizer and a
GradScaler; ``train`` runs ``while self.step < self.train_num_steps`` with an inner loop of
``gradient_accumulate_every`` micro-steps (each loss divided by the count, its ``.item()``
summed into ``total_loss``, backward through the scaler), then unscales, clips, steps,
updates, zeroes the gradients, advances ``self.step`` and updates the EMA. Every
``save_and_sample_every`` steps the EMA model samples under ``torch.no_grad()`` in eval mode
and ``save`` writes ``{"step", "model", "opt", "ema", "scaler"}``. Hard: the EMA reads the
model right after each step through another object, and the loss is the model's forward.
"""

import copy
import io
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Denoiser(nn.Module):
    def __init__(self, dim=6, steps=10):
        super().__init__()
        self.time_embed = nn.Embedding(steps, 8)
        self.net = nn.Sequential(nn.Linear(dim + 8, 32), nn.SiLU(), nn.Linear(32, dim))

    def forward(self, x, t):
        return self.net(torch.cat([x, self.time_embed(t)], dim=-1))


class GaussianDiffusion(nn.Module):
    def __init__(self, model, timesteps=10):
        super().__init__()
        self.model = model
        self.num_timesteps = timesteps
        betas = torch.linspace(1e-4, 0.2, timesteps)
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        self.register_buffer("betas", betas)
        self.register_buffer("sqrt_alphas_cumprod", alphas_cumprod.sqrt())
        self.register_buffer("sqrt_one_minus_alphas_cumprod", (1.0 - alphas_cumprod).sqrt())

    def q_sample(self, x_start, t, noise):
        return self.sqrt_alphas_cumprod[t, None] * x_start + self.sqrt_one_minus_alphas_cumprod[t, None] * noise

    def forward(self, x_start, t, noise):
        x_noisy = self.q_sample(x_start, t, noise)
        return F.mse_loss(self.model(x_noisy, t), noise)

    @torch.no_grad()
    def sample(self, noise):
        x = noise
        for t in reversed(range(self.num_timesteps)):
            ts = torch.full((x.shape[0],), t, dtype=torch.long)
            eps = self.model(x, ts)
            beta = self.betas[t]
            x = (x - beta / self.sqrt_one_minus_alphas_cumprod[t] * eps) / math.sqrt(1.0 - beta.item())
        return x


class EMA:
    def __init__(self, model, beta=0.9, update_every=2, update_after_step=2):
        self.online_model = model
        self.ema_model = copy.deepcopy(model)
        self.ema_model.requires_grad_(False)
        self.beta, self.update_every, self.update_after_step = beta, update_every, update_after_step
        self.step = 0

    @torch.no_grad()
    def update(self):
        self.step += 1
        if self.step % self.update_every != 0:
            return
        if self.step <= self.update_after_step:
            self.ema_model.load_state_dict(self.online_model.state_dict())
            return
        for ema_p, p in zip(self.ema_model.parameters(), self.online_model.parameters()):
            ema_p.lerp_(p, 1.0 - self.beta)


class Trainer:
    def __init__(self, diffusion_model, data, train_num_steps=6, gradient_accumulate_every=2, save_and_sample_every=3):
        self.model = diffusion_model
        self.data = data
        self.train_num_steps = train_num_steps
        self.gradient_accumulate_every = gradient_accumulate_every
        self.save_and_sample_every = save_and_sample_every
        self.gen = torch.Generator().manual_seed(23)
        self.opt = torch.optim.Adam(diffusion_model.parameters(), lr=2e-3, betas=(0.9, 0.99))
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
        self.ema = EMA(diffusion_model, beta=0.8, update_every=2, update_after_step=2)
        self.step = 0
        self.saved = None

    def next_batch(self):
        batch = self.data[self.step % len(self.data)]
        t = torch.randint(0, self.model.num_timesteps, (batch.shape[0],), generator=self.gen)
        return batch, t, torch.randn(batch.shape, generator=self.gen)

    def save(self):
        data = {
            "step": self.step,
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "ema": self.ema.ema_model.state_dict(),
            "scaler": self.scaler.state_dict(),
        }
        self.saved = io.BytesIO()
        torch.save(data, self.saved)

    def train(self):
        while self.step < self.train_num_steps:
            total_loss = 0.0
            for _ in range(self.gradient_accumulate_every):
                x, t, noise = self.next_batch()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = self.model(x, t, noise)
                    loss = loss / self.gradient_accumulate_every
                    total_loss += loss.item()
                self.scaler.scale(loss).backward()

            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad()

            self.step += 1
            self.ema.update()
            print(f"step {self.step} loss {total_loss!r}")

            if self.step % self.save_and_sample_every == 0:
                self.ema.ema_model.eval()
                with torch.no_grad():
                    samples = self.ema.ema_model.sample(torch.randn(4, 6, generator=self.gen))
                print(f"sample {self.step} mean {samples.mean().item()!r}")
                self.save()


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(4)
    data = [torch.randn(8, 6, generator=gen) * 0.5 + 1.0 for _ in range(3)]
    diffusion = GaussianDiffusion(Denoiser())
    trainer = Trainer(diffusion, data)
    trainer.train()
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
