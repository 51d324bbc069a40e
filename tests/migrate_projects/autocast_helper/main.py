"""Shape: autocast returned by helper functions (issue 10, shape 5).

``precision.get_autocast(cfg)`` returns either ``torch.autocast(...)`` or a
``nullcontext()``, and ``precision.maybe_autocast`` is a ``@contextmanager`` generator
wrapping autocast; the student forward runs under one, the teacher's under the other
(distillation). Hard: what autocast state the forward has is decided in another module.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from precision import get_autocast, maybe_autocast


def distill_loss(student_logits, teacher_logits, labels, temperature=2.0, alpha=0.5):
    soft = F.kl_div(
        F.log_softmax(student_logits.float() / temperature, dim=-1),
        F.softmax(teacher_logits.float() / temperature, dim=-1),
        reduction="batchmean",
    ) * temperature**2
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits.float(), labels)


def main():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(9, 32), nn.ReLU(), nn.Linear(32, 5)).eval()
    student = nn.Sequential(nn.Linear(9, 12), nn.ReLU(), nn.Linear(12, 5))
    optimizer = torch.optim.Adamax(student.parameters(), lr=4e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**15)
    gen = torch.Generator().manual_seed(15)
    for step in range(8):
        x = torch.randn(16, 9, generator=gen)
        labels = torch.randint(0, 5, (16,), generator=gen)
        with torch.no_grad(), maybe_autocast(True):
            teacher_logits = teacher(x)
        with get_autocast("bf16"):
            loss = distill_loss(student(x), teacher_logits, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
