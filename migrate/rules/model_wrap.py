"""Rule model_wrap: the model is wrapped with roundpipe.RoundPipe where the optimizer is built."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="model_wrap",
    order=60,
    description="the model is wrapped with roundpipe.RoundPipe where the optimizer is built",
    codes=("RPM101", "RPM108"),
    implemented_in=("steps.py", "parallel.py"),
    patterns=(
        Pattern(
            "the model",
            "wrapped with `roundpipe.RoundPipe` right before the optimizer is built, and the optimizer built on `model.optim_parameters()`",
            "模型",
            "在构建优化器之前用 `roundpipe.RoundPipe` 包装，优化器改为在 `model.optim_parameters()` 上构建",
        ),
        Pattern(
            "training loop in a function receiving model/optimizer/scaler from callers in the same file",
            "followed through the call sites",
            "位于函数中的训练循环，其 model/optimizer/scaler 由同一文件中的调用者传入",
            "沿调用点追踪",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                "model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))\n    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    model = torch.nn.DataParallel(model)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            codes=("RPM101",),
        ),
        Example(
            "import torch\n\n# a plain fp32 model and optimizer; GradScaler only named in this comment\nmodel = torch.nn.Linear(2, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        ),
    ),
)
