"""detectron2-style hooks: the scheduler steps and checkpoints are taken after each step."""

from train_loop import HookBase


class LRScheduler(HookBase):
    """Records the lr of the largest group and steps the scheduler after every step."""

    def __init__(self, optimizer, scheduler):
        self._optimizer = optimizer
        self._scheduler = scheduler

    def before_train(self):
        largest = max(len(g["params"]) for g in self._optimizer.param_groups)
        self._best_param_group_id = next(
            i for i, g in enumerate(self._optimizer.param_groups) if len(g["params"]) == largest
        )

    def after_step(self):
        lr = self._optimizer.param_groups[self._best_param_group_id]["lr"]
        self.trainer.storage.put_scalar("lr", lr)
        self._scheduler.step()


class PeriodicWriter(HookBase):
    def __init__(self, period):
        self._period = period

    def after_step(self):
        if (self.trainer.iter + 1) % self._period == 0:
            storage = self.trainer.storage
            print(f"step {self.trainer.iter} loss {storage.latest('total_loss')!r} lr {storage.latest('lr')!r}")


class PeriodicCheckpointer(HookBase):
    def __init__(self, store, model, optimizer, scheduler, period):
        self.store = store
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.period = period

    def after_step(self):
        if (self.trainer.iter + 1) % self.period == 0:
            self.store["model"] = {k: v.clone() for k, v in self.model.state_dict().items()}
            self.store["optimizer"] = self.optimizer.state_dict()
            self.store["scheduler"] = self.scheduler.state_dict()
            self.store["trainer"] = self.trainer.state_dict()
