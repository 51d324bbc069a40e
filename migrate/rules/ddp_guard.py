"""Rule ddp_guard: a DDP wrap under a `distributed` guard keeps the single-process path and
stops the multi-process one; `model_without_ddp` aliases and `no_sync` blocks follow."""

from . import Example, Pattern, Rule

_GUARDED = """import contextlib

import torch


def train(model, batches, distributed, accum_steps):
    model_without_ddp = model
    if distributed:
        # one process per device
        model = torch.nn.parallel.DistributedDataParallel(model)
        model_without_ddp = model.module
    optimizer = torch.optim.SGD(model_without_ddp.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for step, (x, y) in enumerate(batches):
        update = (step + 1) % accum_steps == 0
        ctx = model.no_sync() if distributed and not update else contextlib.nullcontext()
        with ctx:
            with torch.autocast("cuda"):
                loss = torch.nn.functional.mse_loss(model(x), y) / accum_steps
            scaler.scale(loss).backward()
        if update:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    torch.save(model_without_ddp.state_dict(), "last.pt")
"""

RULE = Rule(
    name="ddp_guard",
    order=63,
    description=(
        "a DDP wrap under a `distributed` guard keeps the single-process path and stops the "
        "multi-process one; `model_without_ddp` aliases and `no_sync` blocks follow"
    ),
    codes=("RPM101", "RPM114"),
    implemented_in=("ddp_guard.py", "rules/model_wrap.py", "model_uses.py"),
    patterns=(
        Pattern(
            "`if args.distributed: model = DistributedDataParallel(model, ...); model_without_ddp = "
            "model.module` before the optimizer, built on `model_without_ddp.parameters()` "
            "(`model_without_ddp = model` before the guard)",
            "the guard's body becomes `raise RuntimeError(...)` (RoundPipe places the model itself; "
            "comments kept), `model` is wrapped before the optimizer and `model_without_ddp = model` "
            "bound again after the wrap, so its checkpoints become `model_without_ddp.model."
            "state_dict()` after a synchronize; a guarded wrap after the optimizer is stopped the same "
            "way; an unguarded wrap, or a guard doing other work, refuses the file (RPM101)",
            "优化器之前的 `if args.distributed: model = DistributedDataParallel(model, ...); "
            "model_without_ddp = model.module`，优化器基于 `model_without_ddp.parameters()` 构建"
            "（判断之前有 `model_without_ddp = model`）",
            "判断体改为 `raise RuntimeError(...)`（RoundPipe 自己放置模型；注释保留），在优化器之前包装 "
            "`model`，并在包装后重新绑定 `model_without_ddp = model`，于是它的检查点在同步之后改为 "
            "`model_without_ddp.model.state_dict()`；优化器之后的带判断包装同样处理；没有判断的包装，"
            "或判断里还做别的事，文件被拒绝（RPM101）",
        ),
        Pattern(
            "accumulation micro-steps in `with model.no_sync() if ... else nullcontext():` (or a "
            "variable holding that choice), the optimizer step after the block",
            "the step after the block belongs to the backward inside it; the block is kept (on one "
            "process it is the `nullcontext`)",
            "在 `with model.no_sync() if ... else nullcontext():`（或保存该选择的变量）中的梯度累积微步，"
            "优化器步骤在该块之后",
            "块之后的步骤属于块内的反向传播；该块保持不变（单进程时即 `nullcontext`）",
        ),
    ),
    examples=(
        Example(
            _GUARDED,
            expect=(
                "    if distributed:\n        # one process per device\n        raise RuntimeError(",
                "    model = roundpipe.RoundPipe(model, model_run_config=",
                "    model_without_ddp = model\n    optimizer = torch.optim.SGD(model_without_ddp.optim_parameters(), lr=0.1)",
                "        with ctx:\n            with torch.autocast",
                '    model_without_ddp.synchronize()\n    torch.save(model_without_ddp.model.state_dict(), "last.pt")',
            ),
        ),
        Example(  # the guarded wrap after the optimizer is built
            "import torch\n\n\ndef train(model, batches, distributed):\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    if distributed:\n        model = torch.nn.parallel.DistributedDataParallel(model)\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    for x, y in batches:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        optimizer.zero_grad()\n",
            expect=(
                "    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)\n"
                "    if distributed:\n        raise RuntimeError(",
            ),
        ),
        Example(  # the guard also changes the device: not only a wrap
            _GUARDED.replace(
                "        model_without_ddp = model.module\n",
                "        model_without_ddp = model.module\n        torch.cuda.set_device(0)\n",
            ),
            codes=("RPM101",),
        ),
        Example(  # near-miss: a DDP script without a scaler is left alone
            "import torch\n\n# GradScaler is not used\n\n\ndef wrap(model, distributed):\n"
            "    if distributed:\n        model = torch.nn.parallel.DistributedDataParallel(model)\n    return model\n",
        ),
    ),
)
