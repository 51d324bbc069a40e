"""Rule: the RoundPipe header goes into the top import block, with fresh names.

Module code (`sys.path` set-up, a module-level model) runs before a later import, and the
user already has a `NUM_MICROBATCH` constant: `import roundpipe` lands before the module
code uses it (no NameError), and the generated constant gets a name of its own."""

import sys

import roundpipe
import torch

NUM_MICROBATCH_2 = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

sys.path.insert(0, ".")
NUM_MICROBATCH = 4  # the user's own constant, unrelated to RoundPipe

import torch.nn.functional as F  # noqa: E402  (late import, after module code)

model = torch.nn.Linear(8, 2)
model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH_2))
optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
scaler = roundpipe.GradScaler()


def train(loader):
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):

            def _loss_fn(_outputs, y):
                loss = F.cross_entropy(_outputs, y) * NUM_MICROBATCH
                return scaler.scale(loss) / NUM_MICROBATCH_2

            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()
