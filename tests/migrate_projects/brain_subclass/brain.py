"""A SpeechBrain-style ``Brain``: the training loop, AMP, accumulation and checks live in the
base class; a recipe subclasses it and only says how to compute the forward and the loss."""

import torch


class Stage:
    TRAIN = "train"
    VALID = "valid"


class Brain:
    def __init__(self, modules, opt_class, hparams, precision="bf16"):
        self.modules = torch.nn.ModuleDict(modules)
        self.hparams = hparams
        self.opt_class = opt_class
        self.precision = precision
        self.grad_accumulation_factor = hparams.get("grad_accumulation_factor", 1)
        self.max_grad_norm = hparams.get("max_grad_norm", 5.0)
        self.step = 0
        self.optimizer_step = 0
        self.scaler = torch.amp.GradScaler("cpu", enabled=precision == "bf16", init_scale=512.0, growth_interval=3)
        self.init_optimizers()

    def init_optimizers(self):
        self.optimizer = self.opt_class(self.modules.parameters())

    def compute_forward(self, batch, stage):
        raise NotImplementedError

    def compute_objectives(self, predictions, batch, stage):
        raise NotImplementedError

    def check_gradients(self, loss):
        """Skip the update when the loss is not finite; clip otherwise."""
        if not torch.isfinite(loss):
            print(f"non-finite loss {loss.item()!r}, update skipped")
            return False
        torch.nn.utils.clip_grad_norm_(self.modules.parameters(), self.max_grad_norm)
        return True

    def fit_batch(self, batch):
        should_step = self.step % self.grad_accumulation_factor == 0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            outputs = self.compute_forward(batch, Stage.TRAIN)
            loss = self.compute_objectives(outputs, batch, Stage.TRAIN)
        self.scaler.scale(loss / self.grad_accumulation_factor).backward()
        if should_step:
            self.scaler.unscale_(self.optimizer)
            if self.check_gradients(loss):
                self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer_step += 1
        return loss.detach().cpu()

    @torch.no_grad()
    def evaluate_batch(self, batch, stage):
        out = self.compute_forward(batch, stage=stage)
        return self.compute_objectives(out, batch, stage=stage).detach().cpu()

    def fit(self, epochs, train_set, valid_set):
        for epoch in range(epochs):
            self.modules.train()
            for batch in train_set:
                self.step += 1
                loss = self.fit_batch(batch)
                print(f"step {self.step} loss {loss.item()!r}")
            self.modules.eval()
            valid = sum(self.evaluate_batch(b, Stage.VALID).item() for b in valid_set) / len(valid_set)
            print(f"epoch {epoch} valid {valid!r}")
