"""Shape: the script driving a trainer class reads and writes its state (issue 10, shape 1).

``trainer.py`` holds the trainer; ``main.py`` builds one and, after each training call,
reads what its step works on through the instance: the learning rate from
``trainer.optimizer.param_groups``, the parameter count from ``trainer.model.parameters()``,
a checkpoint dict of ``trainer.model.state_dict()``, ``trainer.optimizer.state_dict()`` and
``trainer.scaler.state_dict()``, an evaluation of ``trainer.model`` by a function of its own;
it steps ``trainer.scheduler`` and writes a learning rate into ``trainer.optimizer.param_groups``. Hard: every one of those uses is in another file than
the class, and in the asynchronous form each would race with the step still running (the
checkpoint would hold weights and momentum one step old, the learning-rate write could land
during the step).
"""

import io

import torch

from trainer import Trainer


def checksum(state):
    """One number for a state dict's tensors (nested ones included)."""
    if isinstance(state, torch.Tensor):
        return float(state.double().sum())
    if isinstance(state, dict):
        return sum(checksum(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(checksum(v) for v in state)
    return 0.0


def evaluate(model, x):
    """The model's output sum on ``x``, in eval mode and without gradients."""
    model.eval()
    with torch.no_grad():
        out = model(x)
    model.train()
    return float(out.double().sum())


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(7)
    batches = [(torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)) for _ in range(6)]
    trainer = Trainer(width=12, lr=0.2)
    for epoch, (x, y) in enumerate(batches):
        loss = trainer.train_step(x, y)
        print(f"step {trainer.steps} loss {loss.item()!r}")
        lr = trainer.optimizer.param_groups[0]["lr"]
        count = sum(p.numel() for p in trainer.model.parameters())
        buffer = io.BytesIO()
        torch.save(
            {
                "model": trainer.model.state_dict(),
                "opt": trainer.optimizer.state_dict(),
                "scaler": trainer.scaler.state_dict(),
            },
            buffer,
        )
        buffer.seek(0)
        saved = torch.load(buffer)
        print(f"epoch {epoch} lr {lr!r} params {count} keys {sorted(saved['model'])}")
        print(f"epoch {epoch} weights {checksum(saved['model'])!r} momentum {checksum(saved['opt']['state'])!r}")
        print(f"epoch {epoch} eval {evaluate(trainer.model, batches[0][0])!r}")
        trainer.scheduler.step()
        if epoch == 2:
            trainer.optimizer.param_groups[0]["lr"] = 0.05  # a restart the next step must see
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
