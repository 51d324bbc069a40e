"""Shape: an optimizer wrapper class that owns the scaler (issue 10, shapes 2 and 3).

``amp_optimizer.AMPOptimizer`` wraps Adam and a GradScaler behind an optimizer-like
interface (``backward``, ``clip_grad_norm``, ``step``, ``zero_grad``, ``state_dict`` with the
scaler's state inside); the task's ``train_step`` only talks to that interface, as fairseq
trainers do. Hard: the loop never names a scaler, and the wrapper is called an optimizer.
"""

import roundpipe
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_optimizer import AMPOptimizer


def train_step(sample, model, optimizer, update_num, clip_norm=0.5):
    model.train()
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net_output = model(sample["net_input"])
        loss = F.nll_loss(F.log_softmax(net_output.float(), dim=-1), sample["target"], reduction="sum")
    sample_size = sample["target"].numel()
    optimizer.backward(loss / sample_size)
    grad_norm = optimizer.clip_grad_norm(clip_norm)
    optimizer.step()
    return {"loss": loss.item() / sample_size, "gnorm": grad_norm.item(), "num_updates": update_num + 1}


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 6))
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=1))
    optimizer = AMPOptimizer(model.optim_parameters(), lr=3e-3, model=model)
    gen = torch.Generator().manual_seed(26)
    for update_num in range(8):
        sample = {"net_input": torch.randn(14, 10, generator=gen), "target": torch.randint(0, 6, (14,), generator=gen)}
        log = train_step(sample, model, optimizer, update_num)
        print(f"step {log['num_updates']} loss {log['loss']!r} gnorm {log['gnorm']!r}")
    print(f"final scale {optimizer.state_dict()['loss_scaler']['scale']!r}")


if __name__ == "__main__":
    main()
