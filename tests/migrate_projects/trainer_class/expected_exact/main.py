"""Shape: a trainer class (issue 10, shape 1), migrated by hand: the --exact target.

Fused form: the forward and the loss move into ``forward_backward``'s loss function; the
clipping (on the optimizer copies), the step, ``zero_grad`` and the scheduler move into the
step function; checkpoints save and load the wrapped module (``self.model.model``) after
``synchronize()``, so their keys stay those of the original.

Original docstring:

The scaler, model, optimizer and scheduler live on ``self``, built in ``__init__``; the step
is a method (``train_step``) called from another method (``fit``); ``state_dict`` and
``load_state_dict`` carry the scaler, and the run resumes from a checkpoint halfway. Hard:
every object is reached through ``self.``, and the checkpoint code belongs to the same class.
"""

import io

import roundpipe
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, dim_in=10, hidden=32, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(dim_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Trainer:
    def __init__(self, lr=3e-3, max_norm=1.0, amp_dtype=torch.bfloat16):
        self.model = roundpipe.RoundPipe(MLP())
        self.optimizer = torch.optim.AdamW(self.model.optim_parameters(), lr=lr, weight_decay=0.05)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.scaler = roundpipe.GradScaler(init_scale=2.0**12, growth_interval=4)
        self.amp_dtype = amp_dtype
        self.max_norm = max_norm
        self.global_step = 0

    def train_step(self, x, y):
        self.model.train()
        with torch.autocast("cpu", dtype=self.amp_dtype):
            loss = self.model.forward_backward(
                input_args=(x,),
                label=y,
                loss_fn=lambda logits, y: self.scaler.scale(F.cross_entropy(logits, y)),
            ) / self.scaler.get_scale()

        def step_fn():
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.optim_parameters(), self.max_norm)
            self.scaler.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()

        self.model.step(step_fn, is_async=False)
        self.scaler.update()
        self.global_step += 1
        return loss.detach()

    def fit(self, batches):
        for x, y in batches:
            loss = self.train_step(x, y)
            print(f"step {self.global_step} loss {loss.item()!r}")

    def state_dict(self):
        self.model.synchronize()
        return {
            "model": self.model.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "global_step": self.global_step,
        }

    def load_state_dict(self, state):
        self.model.synchronize()
        self.model.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.global_step = state["global_step"]


def make_batches(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 10, generator=gen), torch.randint(0, 4, (16,), generator=gen)) for _ in range(n)]


def main():
    torch.manual_seed(0)
    batches = make_batches(8)
    trainer = Trainer()
    trainer.fit(batches[:4])
    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(1)
    resumed = Trainer()
    resumed.load_state_dict(torch.load(buffer))
    resumed.fit(batches[4:])
    print(f"final scale {resumed.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
