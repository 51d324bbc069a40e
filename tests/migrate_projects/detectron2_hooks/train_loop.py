"""detectron2-style training loop: a trainer base with hooks, a plain and an AMP trainer."""

import weakref

import torch


class HookBase:
    trainer = None

    def before_train(self):
        pass

    def after_train(self):
        pass

    def before_step(self):
        pass

    def after_step(self):
        pass


class EventStorage:
    def __init__(self):
        self.history = {}
        self.iter = 0

    def put_scalar(self, name, value):
        self.history.setdefault(name, []).append(value)

    def latest(self, name):
        return self.history[name][-1]


class TrainerBase:
    def __init__(self):
        self._hooks = []
        self.iter = 0
        self.start_iter = 0
        self.max_iter = 0
        self.storage = EventStorage()

    def register_hooks(self, hooks):
        hooks = [h for h in hooks if h is not None]
        for h in hooks:
            h.trainer = weakref.proxy(self)
        self._hooks.extend(hooks)

    def train(self, start_iter, max_iter):
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        self.before_train()
        for self.iter in range(start_iter, max_iter):
            self.before_step()
            self.run_step()
            self.after_step()
        self.iter += 1
        self.after_train()

    def before_train(self):
        for h in self._hooks:
            h.before_train()

    def after_train(self):
        self.storage.iter = self.iter
        for h in self._hooks:
            h.after_train()

    def before_step(self):
        self.storage.iter = self.iter
        for h in self._hooks:
            h.before_step()

    def after_step(self):
        for h in self._hooks:
            h.after_step()

    def run_step(self):
        raise NotImplementedError

    def state_dict(self):
        return {"iteration": self.iter}

    def load_state_dict(self, state_dict):
        self.start_iter = state_dict["iteration"]


class SimpleTrainer(TrainerBase):
    def __init__(self, model, data_loader, optimizer):
        super().__init__()
        model.train()
        self.model = model
        self.data_loader = data_loader
        self._data_loader_iter = iter(data_loader)
        self.optimizer = optimizer

    def run_step(self):
        data = next(self._data_loader_iter)
        loss_dict = self.model(data)
        losses = sum(loss_dict.values())
        self.optimizer.zero_grad()
        losses.backward()
        self._write_metrics(loss_dict)
        self.optimizer.step()

    def _write_metrics(self, loss_dict, prefix=""):
        metrics_dict = {k: v.detach().cpu().item() for k, v in loss_dict.items()}
        total_losses_reduced = sum(metrics_dict.values())
        if not torch.isfinite(torch.tensor(total_losses_reduced)):
            raise FloatingPointError(f"Loss became infinite or NaN at iteration={self.iter}!")
        self.storage.put_scalar(f"{prefix}total_loss", total_losses_reduced)
        for k, v in metrics_dict.items():
            self.storage.put_scalar(k, v)


class AMPTrainer(SimpleTrainer):
    def __init__(self, model, data_loader, optimizer, grad_scaler=None):
        super().__init__(model, data_loader, optimizer)
        if grad_scaler is None:
            grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
        self.grad_scaler = grad_scaler

    def run_step(self):
        data = next(self._data_loader_iter)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_dict = self.model(data)
            losses = sum(loss_dict.values())
        self.optimizer.zero_grad()
        self.grad_scaler.scale(losses).backward()
        self._write_metrics(loss_dict)
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()

    def state_dict(self):
        ret = super().state_dict()
        ret["grad_scaler"] = self.grad_scaler.state_dict()
        return ret

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
