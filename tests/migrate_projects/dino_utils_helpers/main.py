"""Shape: DINO's gradient helpers living in the project's utils module.

The loop of a DINO-style student/teacher trainer, with its gradient work done by functions
of ``utils.py``, as the DINO repository organises it: the per-parameter clipping that
returns the norms is imported under another name (``from utils import clip_gradients as
clip_per_parameter``), dropping the head's last-layer gradients in the first epoch is
called through the module (``utils.cancel_gradients_last_layer``), and a plain path without
a scaler clips the total norm through a project wrapper of ``clip_grad_norm_``
(``utils.clip_total_norm``) whose result is printed. Hard: the helpers are handed the
trained model (or its parameters) from another file, between the backward and the step,
while the teacher's EMA reads the student right after every step.
"""

import argparse
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import utils
from utils import clip_gradients as clip_per_parameter


class Head(nn.Module):
    def __init__(self, dim, out_dim):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, 16), nn.GELU(), nn.Linear(16, 8))
        self.last_layer = nn.Linear(8, out_dim, bias=False)

    def forward(self, x):
        x = F.normalize(self.mlp(x), dim=-1)
        return self.last_layer(x)


class MultiCropWrapper(nn.Module):
    """Runs the backbone on every crop and the head on the concatenated features."""

    def __init__(self, backbone, head):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, crops):
        features = torch.cat([self.backbone(crop) for crop in crops])
        return self.head(features)


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, student_temp=0.1, teacher_temp=0.04, center_momentum=0.9):
        super().__init__()
        self.ncrops = ncrops
        self.student_temp = student_temp
        self.teacher_temp = teacher_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(self, student_output, teacher_output):
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        teacher_out = F.softmax((teacher_output - self.center) / self.teacher_temp, dim=-1).detach().chunk(2)
        total, n_terms = 0.0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                total = total + torch.sum(-q * F.log_softmax(student_out[v].float(), dim=-1), dim=-1).mean()
                n_terms += 1
        self.update_center(teacher_output)
        return total / n_terms

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True) / len(teacher_output)
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


def cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0.0):
    warmup_iters = warmup_epochs * niter_per_ep
    warmup = np.linspace(start_warmup_value, base_value, warmup_iters) if warmup_iters > 0 else np.array([])
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))
    return np.concatenate((warmup, schedule))


def get_params_groups(model):
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def make_views(gen, n_batches):
    batches = []
    for _ in range(n_batches):
        base = torch.randn(4, 6, generator=gen)
        crops = [base + 0.1 * torch.randn(4, 6, generator=gen) for _ in range(4)]
        batches.append(crops)
    return batches


def train_one_epoch(
    student,
    teacher,
    dino_loss,
    data_loader,
    optimizer,
    lr_schedule,
    wd_schedule,
    momentum_schedule,
    epoch,
    fp16_scaler,
    args,
):
    for it, images in enumerate(data_loader):
        it = len(data_loader) * epoch + it
        for i, param_group in enumerate(optimizer.param_groups):
            param_group["lr"] = lr_schedule[it]
            if i == 0:
                param_group["weight_decay"] = wd_schedule[it]

        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fp16_scaler is not None):
            with torch.no_grad():
                teacher_output = teacher(images[:2])
            student_output = student(images)
            loss = dino_loss(student_output, teacher_output)

        if not math.isfinite(loss.item()):
            print(f"Loss is {loss.item()}, stopping training")
            sys.exit(1)

        optimizer.zero_grad()
        param_norms = None
        if fp16_scaler is None:
            loss.backward()
            if args.clip_grad:
                param_norms = [utils.clip_total_norm(student.parameters(), args.clip_grad)]
            utils.cancel_gradients_last_layer(epoch, student, args.freeze_last_layer)
            optimizer.step()
        else:
            fp16_scaler.scale(loss).backward()
            if args.clip_grad:
                fp16_scaler.unscale_(optimizer)
                param_norms = clip_per_parameter(student, args.clip_grad)
            utils.cancel_gradients_last_layer(epoch, student, args.freeze_last_layer)
            fp16_scaler.step(optimizer)
            fp16_scaler.update()

        with torch.no_grad():
            m = momentum_schedule[it]
            for param_q, param_k in zip(student.parameters(), teacher.parameters()):
                param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)

        max_norm = max(param_norms) if param_norms else None
        print(
            f"step {it} loss {loss.item()!r} lr {optimizer.param_groups[0]['lr']!r} "
            f"wd {optimizer.param_groups[0]['weight_decay']!r} max_norm {max_norm!r}"
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--use-fp16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--clip-grad", type=float, default=0.5)
    parser.add_argument("--freeze-last-layer", type=int, default=1)
    parser.add_argument("--momentum-teacher", type=float, default=0.9)
    args = parser.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(7)
    data_loader = make_views(gen, 3)

    student = MultiCropWrapper(nn.Sequential(nn.Linear(6, 12), nn.GELU()), Head(12, 10))
    teacher = MultiCropWrapper(nn.Sequential(nn.Linear(6, 12), nn.GELU()), Head(12, 10))
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False

    dino_loss = DINOLoss(10, ncrops=4)
    optimizer = torch.optim.AdamW(get_params_groups(student))
    fp16_scaler = None
    if args.use_fp16:
        fp16_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)

    niter = len(data_loader)
    lr_schedule = cosine_scheduler(5e-3, 1e-4, args.epochs, niter, warmup_epochs=1)
    wd_schedule = cosine_scheduler(0.04, 0.4, args.epochs, niter)
    momentum_schedule = cosine_scheduler(args.momentum_teacher, 1, args.epochs, niter)

    for epoch in range(args.epochs):
        train_one_epoch(
            student,
            teacher,
            dino_loss,
            data_loader,
            optimizer,
            lr_schedule,
            wd_schedule,
            momentum_schedule,
            epoch,
            fp16_scaler,
            args,
        )
        save_dict = {
            "student": student.state_dict(),
            "teacher": teacher.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch + 1,
            "dino_loss": dino_loss.state_dict(),
        }
        if fp16_scaler is not None:
            save_dict["fp16_scaler"] = fp16_scaler.state_dict()
        print(
            f"epoch {epoch} center {dino_loss.center.sum().item()!r} teacher {sum(p.sum().item() for p in teacher.parameters())!r}"
        )
    print(f"final scale {fp16_scaler.get_scale() if fp16_scaler is not None else None!r}")


if __name__ == "__main__":
    main()
