"""Rule: the RoundPipe header goes into the top import block, with fresh names.

Module code (`sys.path` set-up, a module-level model) runs before a later import, and the
user already has a `NUM_MICROBATCH` constant: `import roundpipe` lands before the module
code uses it (no NameError), and the generated constant gets a name of its own."""

import sys

import torch

sys.path.insert(0, ".")
NUM_MICROBATCH = 4  # the user's own constant, unrelated to RoundPipe

import torch.nn.functional as F  # noqa: E402  (late import, after module code)

model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")


def train(loader):
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y) * NUM_MICROBATCH
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
