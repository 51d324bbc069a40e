"""fairseq-style ``Trainer``: the optimizer and the schedule built lazily behind properties."""

from itertools import chain

import torch

from optim import AMPOptimizer, FairseqAdam, InverseSquareRootSchedule


class Trainer:
    def __init__(self, cfg, task, model, criterion):
        self.cfg = cfg
        self.task = task
        self._model = model
        self._criterion = criterion
        self._optimizer = None
        self._lr_scheduler = None
        self._num_updates = 0

    @property
    def model(self):
        return self._model

    @property
    def criterion(self):
        return self._criterion

    @property
    def optimizer(self):
        if self._optimizer is None:
            self._build_optimizer()
        return self._optimizer

    @property
    def lr_scheduler(self):
        if self._lr_scheduler is None:
            self._build_optimizer()
        return self._lr_scheduler

    def _build_optimizer(self):
        params = list(filter(lambda p: p.requires_grad, chain(self.model.parameters(), self.criterion.parameters())))
        if self.cfg.amp:
            self._optimizer = AMPOptimizer(params, lr=self.cfg.lr)
        else:
            self._optimizer = FairseqAdam(params, lr=self.cfg.lr)
        self._lr_scheduler = InverseSquareRootSchedule(self._optimizer, self.cfg.lr, self.cfg.warmup_updates)
        self._lr_scheduler.step_update(0)

    def get_num_updates(self):
        return self._num_updates

    def set_num_updates(self, num_updates):
        self._num_updates = num_updates
        self.lr_scheduler.step_update(num_updates)

    def zero_grad(self):
        self.optimizer.zero_grad()

    def train_step(self, samples):
        self.model.train()
        self.zero_grad()
        logging_outputs, sample_size = [], 0
        for sample in samples:
            loss, sample_size_i, logging_output = self.task.train_step(
                sample, self.model, self.criterion, self.optimizer, self.get_num_updates()
            )
            logging_outputs.append(logging_output)
            sample_size += sample_size_i
        self.optimizer.multiply_grads(1.0 / sample_size)
        grad_norm = self.optimizer.clip_grad_norm(self.cfg.clip_norm)
        if not torch.isfinite(grad_norm).all():
            raise FloatingPointError("gradients are Nan/Inf")
        self.task.optimizer_step(self.optimizer, model=self.model, update_num=self.get_num_updates())
        self.set_num_updates(self.get_num_updates() + 1)
        return {
            "loss": sum(log["loss"] for log in logging_outputs) / sample_size,
            "gnorm": float(grad_norm),
            "lr": self.optimizer.get_lr(),
        }

    def state_dict(self):
        return {"model": self.model.state_dict(), "last_optimizer_state": self.optimizer.state_dict()}
