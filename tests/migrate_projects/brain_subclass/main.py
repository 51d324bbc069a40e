"""Shape: a SpeechBrain-style recipe (issue 10, shapes 1 and 6).

``brain.Brain`` (another file) holds the scaler, the optimizer (built by ``init_optimizers``
from ``self.modules``, a ``ModuleDict``), ``fit``, ``fit_batch`` and ``check_gradients``;
``fit_batch`` decides ``should_step`` from a counter, divides the loss by the accumulation
factor only inside the backward, and steps only when ``check_gradients`` (a finite loss,
then clipping) agrees, but updates the scale either way. The recipe in ``main.py``
subclasses it and overrides ``compute_forward``/``compute_objectives`` (a CTC-like
frame classifier). Hard: the step lives in a base class of another file and the forward
in overridden methods of the subclass; the trained module is a ``ModuleDict`` on ``self``.
"""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from brain import Brain, Stage


class FrameBrain(Brain):
    def compute_forward(self, batch, stage):
        feats, _ = batch
        x = self.modules["encoder"](feats)
        if stage == Stage.TRAIN:
            x = x + 0.0  # augmentation would go here
        return self.modules["classifier"](x)

    def compute_objectives(self, predictions, batch, stage):
        _, targets = batch
        logp = F.log_softmax(predictions.float(), dim=-1)
        return F.nll_loss(logp.reshape(-1, logp.shape[-1]), targets.reshape(-1))


def make_set(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(3, 5, 6, generator=gen), torch.randint(0, 4, (3, 5), generator=gen)) for _ in range(n)]


def main():
    torch.manual_seed(7)
    modules = {"encoder": nn.Sequential(nn.Linear(6, 12), nn.ReLU()), "classifier": nn.Linear(12, 4)}
    hparams = {"grad_accumulation_factor": 2, "max_grad_norm": 1.0}
    brain = FrameBrain(modules, functools.partial(torch.optim.Adam, lr=3e-3), hparams)
    brain.fit(2, make_set(5, seed=1), make_set(2, seed=2))
    print(f"final scale {brain.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
