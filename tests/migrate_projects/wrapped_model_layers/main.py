"""Shape: the model's layers and helper methods read through the model after the wrap.

A Tacotron2-style model keeps ``parse_batch`` on the module class (a plain function of the
batch that never touches ``self``) and is an ``nn.Sequential``, so the training loop reads
``len(model)``, logs ``model[-1].weight`` after each step, counts its ``nn.Linear`` layers
by iterating it, and after training prints the first layer's bias and the layer types.
Hard: a RoundPipe model forwards attribute reads to the wrapped module but is not a
container of its layers, and a method of the model called where it is trained would run
outside RoundPipe unless it provably reads no weight.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SpeechNet(nn.Sequential):
    def __init__(self, hidden=16):
        super().__init__(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def parse_batch(self, batch):
        features, target, mask = batch
        return features * mask.unsqueeze(-1), target


def make_batches(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(12, 6, generator=gen),
            torch.randn(12, 1, generator=gen),
            (torch.rand(12, generator=gen) > 0.2).float(),
        )
        for _ in range(n)
    ]


def main():
    torch.manual_seed(0)
    model = SpeechNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    print(f"layers {len(model)} linear {sum(isinstance(m, nn.Linear) for m in model)}")
    step = 0
    for epoch in range(2):
        for batch in make_batches(4, seed=epoch):
            x, y = model.parse_batch(batch)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = F.mse_loss(out.float(), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            print(f"step {step} loss {loss.item()!r} head {model[-1].weight.abs().sum().item()!r}")
            step += 1
    print(f"first bias {model[0].bias.sum().item()!r} types {[type(m).__name__ for m in model]}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
