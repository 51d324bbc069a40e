"""Rule autocast: autocast blocks are kept; loss statements after the block stay outside autocast."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="autocast",
    order=20,
    description="autocast blocks are kept; loss statements after the block stay outside autocast",
    codes=(),
    implemented_in=("rules/loss_function.py",),
    patterns=(
        Pattern(
            "any autocast spelling (`torch.autocast`, `torch.amp.autocast`, `torch.cuda.amp.autocast(flag)`, aliases)",
            "kept exactly as written, around `forward_backward`: the forward and the loss run under the same autocast state as before (backward runs outside autocast, as in the original)",
            "任意 autocast 写法（`torch.autocast`、`torch.amp.autocast`、`torch.cuda.amp.autocast(flag)`、别名）",
            "原样保留，包在 `forward_backward` 外面：前向传播和损失计算在与之前相同的 autocast 状态下运行（反向传播在 autocast 之外运行，与原脚本一致）",
        ),
        Pattern(
            "forward inside the autocast block, loss computed after it",
            "the loss statements go into `_loss_fn` under `with <the same autocast>(<device>, enabled=False):`, so they still run outside autocast",
            "前向在 autocast 块内、损失在块之后计算",
            "损失语句移入 `_loss_fn`，并包在 `with <同一个 autocast>(<设备>, enabled=False):` 中，因此仍在 autocast 之外运行",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=('        with torch.autocast("cuda"):\n\n            def _loss_fn(out, y):',),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n        loss = torch.nn.functional.mse_loss(out.float(), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=('with torch.autocast("cuda", enabled=False):',),
        ),
        Example(
            'import torch\n\nwith torch.autocast("cuda"):  # autocast without a GradScaler step\n    y = torch.ones(2) * 2\nscaler = None  # GradScaler is not used here\n',
        ),
    ),
)
