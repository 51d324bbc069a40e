"""nnU-Net-style trainer: the network and optimizer built by ``initialize`` at train start,
hooks around every epoch, deep supervision, a polynomial schedule stepped per epoch."""

from contextlib import nullcontext as dummy_context

import torch
import torch.nn as nn


class PolyLRScheduler(torch.optim.lr_scheduler._LRScheduler):
    """Writes ``initial_lr * (1 - epoch / max_steps) ** exponent`` into every group."""

    def __init__(self, optimizer, initial_lr, max_steps, exponent=0.9, current_step=None):
        self.optimizer = optimizer
        self.initial_lr = initial_lr
        self.max_steps = max_steps
        self.exponent = exponent
        self.ctr = 0
        super().__init__(optimizer, current_step if current_step is not None else -1)

    def step(self, current_step=None):
        if current_step is None or current_step == -1:
            current_step = self.ctr
            self.ctr += 1
        new_lr = self.initial_lr * (1 - current_step / self.max_steps) ** self.exponent
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = new_lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class TinyUNet(nn.Module):
    """Two decoder outputs: full resolution and a deep-supervision head at half."""

    def __init__(self, num_classes=3):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv1d(2, 8, 3, padding=1), nn.InstanceNorm1d(8, affine=True), nn.LeakyReLU(0.01))
        self.down = nn.Conv1d(8, 8, 3, stride=2, padding=1)
        self.seg_half = nn.Conv1d(8, num_classes, 1)
        self.up = nn.ConvTranspose1d(8, 8, 2, stride=2)
        self.seg_full = nn.Conv1d(16, num_classes, 1)

    def forward(self, x):
        skip = self.enc(x)
        low = self.down(skip)
        return [self.seg_full(torch.cat([self.up(low), skip], dim=1)), self.seg_half(low)]


class DeepSupervisionWrapper(nn.Module):
    def __init__(self, loss, weight_factors):
        super().__init__()
        self.loss = loss
        self.weight_factors = weight_factors

    def forward(self, outputs, targets):
        return sum(w * self.loss(o.float(), t) for w, o, t in zip(self.weight_factors, outputs, targets))


class nnUNetTrainer:
    def __init__(self, use_amp=True, num_epochs=3):
        self.use_amp = use_amp
        self.initial_lr = 1e-2
        self.weight_decay = 3e-5
        self.num_iterations_per_epoch = 3
        self.num_epochs = num_epochs
        self.current_epoch = 0
        self.was_initialized = False
        self.grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2) if use_amp else None
        self.logs = []

    def initialize(self):
        if not self.was_initialized:
            torch.manual_seed(0)
            self.network = TinyUNet()
            self.optimizer, self.lr_scheduler = self.configure_optimizers()
            self.loss = DeepSupervisionWrapper(nn.CrossEntropyLoss(), [1.0, 0.5])
            self.was_initialized = True

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(
            self.network.parameters(), self.initial_lr, weight_decay=self.weight_decay, momentum=0.99, nesterov=True
        )
        lr_scheduler = PolyLRScheduler(optimizer, self.initial_lr, self.num_epochs)
        return optimizer, lr_scheduler

    def get_batch(self, gen):
        data = torch.randn(4, 2, 8, generator=gen)
        target = torch.randint(0, 3, (4, 8), generator=gen)
        return {"data": data, "target": [target, target[:, ::2]]}

    def on_train_start(self):
        self.initialize()
        self.gen = torch.Generator().manual_seed(13)

    def on_train_epoch_start(self):
        self.network.train()
        self.lr_scheduler.step(self.current_epoch)

    def train_step(self, batch):
        data = batch["data"]
        target = batch["target"]
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.use_amp else dummy_context():
            output = self.network(data)
            l = self.loss(output, target)
        if self.grad_scaler is not None:
            self.grad_scaler.scale(l).backward()
            self.grad_scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            l.backward()
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
            self.optimizer.step()
        return {"loss": l.detach().cpu().numpy()}

    def on_train_epoch_end(self, train_outputs):
        losses = [float(o["loss"]) for o in train_outputs]
        self.logs.append(sum(losses) / len(losses))

    def validation_step(self, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.use_amp else dummy_context():
            output = self.network(batch["data"])
            l = self.loss(output, batch["target"])
        return {"loss": l.detach().cpu().numpy()}

    def save_checkpoint(self):
        return {
            "network_weights": self.network.state_dict(),
            "optimizer_state": self.optimizer.state_dict(),
            "grad_scaler_state": self.grad_scaler.state_dict() if self.grad_scaler is not None else None,
            "current_epoch": self.current_epoch + 1,
        }

    def load_checkpoint(self, checkpoint):
        if not self.was_initialized:
            self.initialize()
        self.network.load_state_dict(checkpoint["network_weights"])
        self.optimizer.load_state_dict(checkpoint["optimizer_state"])
        self.current_epoch = checkpoint["current_epoch"]
        if self.grad_scaler is not None and checkpoint["grad_scaler_state"] is not None:
            self.grad_scaler.load_state_dict(checkpoint["grad_scaler_state"])

    def run_training(self):
        self.on_train_start()
        step = 0
        for epoch in range(self.current_epoch, self.num_epochs):
            self.on_train_epoch_start()
            train_outputs = []
            for _ in range(self.num_iterations_per_epoch):
                train_outputs.append(self.train_step(self.get_batch(self.gen)))
                print(
                    f"step {step} loss {float(train_outputs[-1]['loss'])!r} lr {self.optimizer.param_groups[0]['lr']!r}"
                )
                step += 1
            self.on_train_epoch_end(train_outputs)
            with torch.no_grad():
                self.network.eval()
                val = self.validation_step(self.get_batch(self.gen))
            print(f"epoch {epoch} train {self.logs[-1]!r} val {float(val['loss'])!r}")
            self.checkpoint = self.save_checkpoint()
            self.current_epoch = epoch + 1
