"""Mixed-precision training in a trainer class, with evaluation and a checkpoint.

The Trainer builds its model, optimizer, scheduler and GradScaler in __init__ and keeps
them on self; train_step() is one iteration, evaluate() runs without gradients, and
state_dict()/load_state_dict() carry the scaler with the rest.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


class Trainer:
    def __init__(self, device, lr=5e-3):
        self.device = device
        self.model = roundpipe.RoundPipe(
            nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to(device),
            model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH),
        )
        self.optimizer = torch.optim.Adam(self.model.optim_parameters(), lr=lr)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.scaler = roundpipe.GradScaler(
            enabled=device != "cuda" or torch.cuda.is_available(),
        )  # disables itself where the device has no AMP
        self.criterion = nn.MSELoss()
        self.global_step = 0

    def train_step(self, inputs, targets):
        with torch.autocast(device_type=self.device, dtype=torch.bfloat16):

            def _loss_fn(output, targets):
                loss = self.criterion(output, targets)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return self.scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            self.model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
            loss = sum(_losses)

        # Backward on the scaled loss; unscale before clipping so the norm is the true one.
        def _step_fn():
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.optim_parameters(), 1.0)
            self.scaler.step(self.optimizer)
            self.optimizer.zero_grad()
            self.scheduler.step()

        self.model.step(_step_fn)
        self.scaler.update()
        self.global_step += 1
        return loss.item()

    def evaluate(self, batches):
        self.model.synchronize()
        self.model.eval()
        total = 0.0
        with torch.no_grad():
            for inputs, targets in batches:
                total += self.criterion(self.model(inputs), targets).item()
        self.model.train()
        return total / len(batches)

    def state_dict(self):
        self.model.synchronize()
        return {
            "model": self.model.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state):
        self.model.synchronize()
        self.model.model.load_state_dict(state["model"])
        self.model.synchronize()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batches = [(torch.randn(16, 10).to(device), torch.randn(16, 2).to(device)) for _ in range(8)]
    val_batches = batches[-2:]

    trainer = Trainer(device)
    for inputs, targets in batches[:4]:
        print(f"step {trainer.global_step} loss {trainer.train_step(inputs, targets):.6f}")
    print(f"eval loss {trainer.evaluate(val_batches):.6f}")

    # Resume in a fresh trainer from the first one's state, the scaler included.
    state = trainer.state_dict()
    print("saved")
    resumed = Trainer(device)
    resumed.load_state_dict(state)
    resumed.global_step = trainer.global_step
    print("loaded")
    for inputs, targets in batches[4:]:
        print(f"step {resumed.global_step} loss {resumed.train_step(inputs, targets):.6f}")
    print(f"eval loss {resumed.evaluate(val_batches):.6f}")


if __name__ == "__main__":
    main()
