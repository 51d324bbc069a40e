"""The ``SimCLR`` trainer: model, optimizer, scheduler and arguments on ``self``; the scaler
is a local of ``train`` built with ``enabled=`` the precision flag."""

import io
import logging

import torch
import torch.nn.functional as F
from torch.amp import GradScaler


def accuracy(output, target, topk=(1,)):
    """Top-k accuracy (in percent) of ``output`` logits against ``target`` classes."""
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0).item() * 100.0 / target.size(0) for k in topk]


def save_checkpoint(state, buffer):
    torch.save(state, buffer)


class SimCLR:
    def __init__(self, *args, **kwargs):
        self.args = kwargs["args"]
        self.model = kwargs["model"]
        self.optimizer = kwargs["optimizer"]
        self.scheduler = kwargs["scheduler"]
        self.criterion = torch.nn.CrossEntropyLoss()

    def info_nce_loss(self, features):
        """Logits of every view against all others, the positive first, and its labels."""
        labels = torch.cat([torch.arange(self.args.batch_size) for _ in range(self.args.n_views)], dim=0)
        labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
        features = F.normalize(features.float(), dim=1)
        similarity_matrix = torch.matmul(features, features.T)
        mask = torch.eye(labels.shape[0], dtype=torch.bool)
        labels = labels[~mask].view(labels.shape[0], -1)
        similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)
        positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)
        negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)
        logits = torch.cat([positives, negatives], dim=1)
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        return logits / self.args.temperature, labels

    def train(self, train_loader):
        scaler = GradScaler("cpu", enabled=self.args.fp16_precision, growth_interval=3)
        n_iter = 0
        logging.info(f"Start SimCLR training for {self.args.epochs} epochs.")
        for epoch_counter in range(self.args.epochs):
            for images, _ in train_loader:
                images = torch.cat(images, dim=0)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.args.fp16_precision):
                    features = self.model(images)
                    logits, labels = self.info_nce_loss(features)
                    loss = self.criterion(logits, labels)

                self.optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(self.optimizer)
                scaler.update()

                if n_iter % self.args.log_every_n_steps == 0:
                    top1, top5 = accuracy(logits, labels, topk=(1, 5))
                    lr = self.scheduler.get_last_lr()[0]
                    print(f"step {n_iter} loss {loss.item()!r} top1 {top1!r} top5 {top5!r} lr {lr!r}")
                n_iter += 1

            if epoch_counter >= 1:
                self.scheduler.step()
            logging.debug(f"Epoch: {epoch_counter}\tLoss: {loss}")

        save_checkpoint(
            {
                "epoch": self.args.epochs,
                "state_dict": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
            },
            io.BytesIO(),
        )
        print(f"final scale {scaler.get_scale()!r}")
