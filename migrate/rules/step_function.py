"""Rule step_function: the optimizer statements move, in order, into a step function for model.step."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="step_function",
    order=50,
    description="the optimizer statements move, in order, into a step function for model.step",
    codes=("RPM102", "RPM106", "RPM107", "RPM134", "RPM135"),
    implemented_in=("steps.py",),
    patterns=(
        Pattern(
            "`scaler.unscale_`, `clip_grad_norm_`/`clip_grad_value_(model.parameters())`, `scaler.step`, `optimizer.zero_grad`, `model.zero_grad`, `scheduler.step()`",
            "moved, in order, into `_step_fn` for `model.step`; clipping uses `model.optim_parameters()`; `model.zero_grad(...)` becomes `optimizer.zero_grad(...)`; `scaler.update()` stays on the main thread after `model.step`",
            "`scaler.unscale_`、`clip_grad_norm_`/`clip_grad_value_(model.parameters())`、`scaler.step`、`optimizer.zero_grad`、`model.zero_grad`、`scheduler.step()`",
            "按原顺序移入交给 `model.step` 的 `_step_fn`；梯度裁剪改用 `model.optim_parameters()`；`model.zero_grad(...)` 变为 `optimizer.zero_grad(...)`；`scaler.update()` 留在主线程上，位于 `model.step` 之后",
        ),
        Pattern(
            "`optimizer.zero_grad()` at the top of the iteration",
            "moved to the end of `_step_fn` (equivalent: the step consumes the gradients)",
            "迭代开头的 `optimizer.zero_grad()`",
            "移到 `_step_fn` 的末尾（等价：步骤会消耗掉梯度）",
        ),
        Pattern(
            "gradient accumulation (`if (i + 1) % k == 0:` around the step)",
            "`forward_backward` every iteration, `model.step` + `scaler.update()` under the same condition",
            "梯度累积（步骤外包着 `if (i + 1) % k == 0:`）",
            "每次迭代都执行 `forward_backward`，`model.step` + `scaler.update()` 放在同一条件下",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.unscale_(optimizer)\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                "def _step_fn():\n            scaler.unscale_(optimizer)\n            torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)\n            scaler.step(optimizer)\n            optimizer.zero_grad()\n\n        model.step(_step_fn)\n        scaler.update()",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer, lambda: loss)\n        scaler.update()\n',
            codes=("RPM102",),
        ),
        Example(  # the optimizer statements after the backward stop before the scaler's step
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        print(loss.item())\n        scaler.step(optimizer)\n        scaler.update()\n',
            codes=("RPM106",),
        ),
        Example(  # the scale updated before the step
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.update()\n        scaler.step(optimizer)\n',
            codes=("RPM134",),
        ),
        Example(
            'import torch\n\n\ndef save(scaler: "torch.amp.GradScaler"):\n    torch.save(scaler.state_dict(), "scaler.pt")  # checkpointing only\n',
        ),
    ),
)
