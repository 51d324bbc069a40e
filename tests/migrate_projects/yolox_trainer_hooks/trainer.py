"""YOLOX-style ``Trainer``: the iteration split over before/train/after methods."""

import torch

from utils import MeterBuffer, ModelEMA


class Trainer:
    def __init__(self, exp, args):
        self.exp = exp
        self.args = args
        self.max_epoch = exp.max_epoch
        self.amp_training = args.fp16
        self.scaler = torch.amp.GradScaler("cpu", enabled=args.fp16, init_scale=2.0**6, growth_interval=3)
        self.is_distributed = False
        self.start_epoch = 0
        self.meter = MeterBuffer()

    def train(self):
        self.before_train()
        try:
            self.train_in_epoch()
        finally:
            self.after_train()

    def train_in_epoch(self):
        for self.epoch in range(self.start_epoch, self.max_epoch):
            self.before_epoch()
            self.train_in_iter()
            self.after_epoch()

    def train_in_iter(self):
        for self.iter in range(self.max_iter):
            self.before_iter()
            self.train_one_iter()
            self.after_iter()

    def train_one_iter(self):
        inps, targets = self.train_loader[self.iter]
        targets.requires_grad = False
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp_training):
            outputs = self.model(inps, targets)

        loss = outputs["total_loss"]

        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

        if self.use_model_ema:
            self.ema_model.update(self.model)

        lr = self.lr_scheduler.update_lr(self.progress_in_iter + 1)
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr

        self.meter.update(lr=lr, **outputs)

    def before_train(self):
        model = self.exp.get_model()
        self.optimizer = self.exp.get_optimizer(self.args.batch_size)
        self.train_loader = self.exp.get_data_loader(self.args.batch_size)
        self.max_iter = len(self.train_loader)
        self.lr_scheduler = self.exp.get_lr_scheduler(self.exp.basic_lr_per_img * self.args.batch_size, self.max_iter)
        if self.is_distributed:
            model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        self.use_model_ema = self.exp.ema
        if self.use_model_ema:
            self.ema_model = ModelEMA(model, 0.9998)
            self.ema_model.updates = self.max_iter * self.start_epoch
        self.model = model
        self.best_ap = float("inf")

    def after_train(self):
        print(f"final scale {self.scaler.get_scale()!r} best {self.best_ap!r}")

    def before_epoch(self):
        self.model.train()

    def after_epoch(self):
        self.save_ckpt(ckpt_name="latest")
        self.evaluate_and_save_model()

    def before_iter(self):
        pass

    def after_iter(self):
        if (self.iter + 1) % self.exp.print_interval == 0:
            print(
                f"step {self.progress_in_iter} loss {self.meter['total_loss']!r} iou {self.meter['iou_loss']!r} "
                f"lr {self.meter['lr']!r}"
            )

    @property
    def progress_in_iter(self):
        return self.epoch * self.max_iter + self.iter

    def evaluate_and_save_model(self):
        evalmodel = self.ema_model.ema if self.use_model_ema else self.model
        evalmodel.eval()
        with torch.no_grad():
            x, targets = self.train_loader[0]
            ap = (evalmodel(x)[:, :4] - targets[:, :4]).abs().mean().item()
        self.model.train()
        print(f"epoch {self.epoch} eval {ap!r}")
        self.best_ap = min(self.best_ap, ap)

    def save_ckpt(self, ckpt_name, update_best_ckpt=False):
        save_model = self.ema_model.ema if self.use_model_ema else self.model
        ckpt_state = {
            "start_epoch": self.epoch + 1,
            "model": save_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        if self.amp_training:
            ckpt_state["amp"] = self.scaler.state_dict()
        self.last_ckpt = ckpt_state
