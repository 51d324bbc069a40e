"""Shape: a data-parallel script run on one process (issue 10, shape 10).

``DistributedDataParallel`` wraps the model only under ``if args.distributed`` (from
``WORLD_SIZE``), with ``model_without_ddp = model.module`` there and ``= model`` otherwise;
accumulation steps enter ``model.no_sync()`` when distributed and a ``nullcontext`` when not;
checkpoints save ``model_without_ddp.state_dict()``. Hard: the single-process path must keep
working, the alias must keep the checkpoint keys, and the DDP branch must stop with a clear
error if it ever runs on RoundPipe.
"""

import argparse
import contextlib
import io
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def init_distributed_mode(args):
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.distributed = args.world_size > 1
    if args.distributed:
        torch.distributed.init_process_group(backend="gloo")
        args.rank = torch.distributed.get_rank()
    else:
        args.rank = 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum-steps", type=int, default=2)
    args = parser.parse_args([])
    init_distributed_mode(args)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
        model_without_ddp = model.module
    optimizer = torch.optim.SGD(model_without_ddp.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
    gen = torch.Generator().manual_seed(19)
    for step in range(12):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        is_update = (step + 1) % args.accum_steps == 0
        sync_ctx = model.no_sync() if args.distributed and not is_update else contextlib.nullcontext()
        with sync_ctx:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / args.accum_steps
            scaler.scale(loss).backward()
        if is_update:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        if args.rank == 0:
            print(f"step {step} loss {loss.item()!r}")
    buffer = io.BytesIO()
    torch.save({"model": model_without_ddp.state_dict(), "scaler": scaler.state_dict()}, buffer)
    keys = sorted(torch.load(io.BytesIO(buffer.getvalue()))["model"])
    print(f"checkpoint keys {keys}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
