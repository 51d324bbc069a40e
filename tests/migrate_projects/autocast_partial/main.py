"""Shape: autocast through ``functools.partial`` (issue 10, shape 5).

``amp_ctx = functools.partial(torch.autocast, device_type="cpu", dtype=torch.bfloat16)`` is
built at module level and entered as ``with amp_ctx():``; the scaler is torch's
``torch.GradScaler`` spelling; the loop trains a small convolutional net. Hard: the autocast
call is not spelled where it is used.
"""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

amp_ctx = functools.partial(torch.autocast, device_type="cpu", dtype=torch.bfloat16)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


def main():
    torch.manual_seed(0)
    model = ConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scaler = torch.GradScaler("cpu", init_scale=4096.0, growth_interval=3)
    gen = torch.Generator().manual_seed(14)
    for step in range(8):
        images = torch.randn(8, 1, 8, 8, generator=gen)
        labels = torch.randint(0, 3, (8,), generator=gen)
        with amp_ctx():
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
