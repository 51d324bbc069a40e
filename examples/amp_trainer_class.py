"""Mixed-precision training in a trainer class, with evaluation and a checkpoint.

The Trainer builds its model, optimizer, scheduler and GradScaler in __init__ and keeps
them on self; train_step() is one iteration, evaluate() runs without gradients, and
state_dict()/load_state_dict() carry the scaler with the rest.
"""

import torch
import torch.nn as nn


class Trainer:
    def __init__(self, device, lr=5e-3):
        self.device = device
        self.model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.scaler = torch.amp.GradScaler(device)  # disables itself where the device has no AMP
        self.criterion = nn.MSELoss()
        self.global_step = 0

    def train_step(self, inputs, targets):
        with torch.autocast(device_type=self.device, dtype=torch.bfloat16):
            output = self.model(inputs)
            loss = self.criterion(output, targets)
        # Backward on the scaled loss; unscale before clipping so the norm is the true one.
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        self.scheduler.step()
        self.global_step += 1
        return loss.item()

    def evaluate(self, batches):
        self.model.eval()
        total = 0.0
        with torch.no_grad():
            for inputs, targets in batches:
                total += self.criterion(self.model(inputs), targets).item()
        self.model.train()
        return total / len(batches)

    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
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
