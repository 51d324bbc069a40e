"""Shape: fairseq's ``Trainer`` and task (held-out round 2; lazily built wrapper optimizers).

``trainer.Trainer`` is handed the task, the model and the criterion; ``optimizer`` and
``lr_scheduler`` are properties that build both on first use (``_build_optimizer``: the
trainable parameters of model and criterion through ``filter``/``chain``, an
``AMPOptimizer`` owning a GradScaler when ``cfg.amp``, else a plain ``FairseqAdam``, and an
inverse-square-root schedule calling ``optimizer.set_lr`` on every update). ``train_step``
runs a delayed update over a list of samples: the task's ``train_step`` computes the
criterion's summed loss under autocast and calls ``optimizer.backward(loss)``; then
``multiply_grads(1 / sample_size)``, ``clip_grad_norm`` (unscaling inside the AMP wrapper),
a non-finite check that raises, the task's ``optimizer_step`` and ``set_num_updates`` (the lr
write). Hard: no line names a scaler outside the wrapper, the optimizer exists only behind a
property, and the lr is written after the step on the main thread.
"""

import argparse

import torch
import torch.nn as nn

from trainer import Trainer


class LabelSmoothedCrossEntropy(nn.Module):
    def __init__(self, eps=0.1):
        super().__init__()
        self.eps = eps

    def forward(self, model, sample):
        logits = model(sample["net_input"]).float()
        lprobs = torch.log_softmax(logits, dim=-1)
        nll = -lprobs.gather(1, sample["target"][:, None]).squeeze(1)
        smooth = -lprobs.mean(dim=-1)
        loss = ((1 - self.eps) * nll + self.eps * smooth).sum()
        sample_size = sample["target"].numel()
        return loss, sample_size, {"loss": loss.item(), "sample_size": sample_size}


class TranslationTask:
    def __init__(self, cfg):
        self.cfg = cfg

    def train_step(self, sample, model, criterion, optimizer, update_num):
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.amp):
            loss, sample_size, logging_output = criterion(model, sample)
        optimizer.backward(loss)
        return loss, sample_size, logging_output

    def optimizer_step(self, optimizer, model, update_num):
        optimizer.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--warmup-updates", type=int, default=3)
    parser.add_argument("--clip-norm", type=float, default=0.5)
    parser.add_argument("--update-freq", type=int, default=2)
    cfg = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(12, 10), nn.Flatten(), nn.Linear(30, 12))
    task = TranslationTask(cfg)
    trainer = Trainer(cfg, task, model, LabelSmoothedCrossEntropy())
    gen = torch.Generator().manual_seed(8)
    for step in range(6):
        samples = []
        for _ in range(cfg.update_freq):
            tokens = torch.randint(0, 12, (5, 3), generator=gen)
            samples.append({"net_input": tokens, "target": tokens[:, 0]})
        log = trainer.train_step(samples)
        print(f"step {step} loss {log['loss']!r} gnorm {log['gnorm']!r} lr {log['lr']!r}")
    state = trainer.state_dict()
    print(f"final scale {state['last_optimizer_state'].get('loss_scale')!r}")


if __name__ == "__main__":
    main()
