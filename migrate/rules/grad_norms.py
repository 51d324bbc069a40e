"""Rule grad_norms: gradient norms measured in the step, clipping under a condition with an
else branch, and norms read after the step."""

from . import Example, Pattern, Rule

_CONDITIONAL = """import torch


def grad_norm_of(parameters):
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))


def train_step(model, optimizer, scaler, x, y, clip):
    with torch.autocast("cuda"):
        loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    if clip > 0:
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    else:
        norm = grad_norm_of(model.parameters()) / scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss.detach(), norm


def main(batches):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in batches:
        loss, norm = train_step(model, optimizer, scaler, x, y, 1.0)
        print(loss.item(), norm.item())
"""

_LOGGED = """import torch


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(grad_norm.item())
"""

RULE = Rule(
    name="grad_norms",
    order=52,
    description=(
        "gradient norms measured in the step, clipping under a condition with an else branch, "
        "and norms read after the step"
    ),
    codes=("RPM134", "RPM135"),
    implemented_in=("step_values.py", "step_decisions.py", "rules/step_function.py"),
    patterns=(
        Pattern(
            "`norm = clip_grad_norm_(model.parameters(), c)` or `norm = helper(model.parameters())` "
            "between the backward and `scaler.step`; `if clip > 0: unscale_ + clip else: measure`",
            "moved into the step function in their order, measuring `model.optim_parameters()`; an "
            "`if`/`else` whose other statements are not optimizer work refuses the file (RPM135); an "
            "`if` choosing the step from the measured norm: rule grad_norm_decisions",
            "反向传播与 `scaler.step` 之间的 `norm = clip_grad_norm_(model.parameters(), c)` 或 "
            "`norm = helper(model.parameters())`；`if clip > 0: unscale_ + 裁剪 else: 计算范数`",
            "按原顺序移入步骤函数，改为在 `model.optim_parameters()` 上计算；若 `if`/`else` 中还有"
            "不属于优化器工作的语句，文件被拒绝（RPM135）；由计算出的范数决定如何执行步骤的 `if`："
            "见规则 grad_norm_decisions",
        ),
        Pattern(
            "a norm measured in the step and read after it (logged, returned)",
            "`nonlocal norm` (`global` at module level; `norm = None` before the step function when "
            "nothing else binds it) and `model.step(step_fn, is_async=False)`: the main thread reads "
            "this iteration's value, never one being written",
            "在步骤中计算、之后被读取（记录日志、返回）的范数",
            "使用 `nonlocal norm`（模块级为 `global`；若别处没有绑定它，则在步骤函数前加 `norm = None`），"
            "并改为 `model.step(step_fn, is_async=False)`：主线程读到的是本次迭代的值，而不是正在写入的值",
        ),
    ),
    examples=(
        Example(
            _CONDITIONAL,
            expect=(
                "    def _step_fn():\n"
                "        nonlocal norm\n"
                "        if clip > 0:\n"
                "            scaler.unscale_(optimizer)\n"
                "            norm = torch.nn.utils.clip_grad_norm_(model.optim_parameters(), clip)\n"
                "        else:\n"
                "            norm = grad_norm_of(model.optim_parameters()) / scaler.get_scale()\n"
                "        scaler.step(optimizer)\n"
                "        optimizer.zero_grad()\n"
                "\n"
                "    model.step(_step_fn, is_async=False)\n"
                "    scaler.update()\n"
                "    return loss.detach(), norm\n",
            ),
        ),
        Example(
            _LOGGED,
            expect=(
                "        grad_norm = None\n\n        def _step_fn():\n            nonlocal grad_norm\n",
                "        model.step(_step_fn, is_async=False)\n",
            ),
        ),
        Example(  # the norm is not read after the step: the step stays asynchronous
            _LOGGED.replace("        print(grad_norm.item())\n", ""),
            expect=("        model.step(_step_fn)\n",),
        ),
        Example(  # the else branch does other work than the optimizer's
            _CONDITIONAL.replace(
                "        norm = grad_norm_of(", '        print("no clip")\n        norm = grad_norm_of('
            ),
            codes=("RPM135",),
        ),
        Example(  # measured after the update: the scale the step used is gone
            _LOGGED.replace(
                "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                "        scaler.step(optimizer)\n        scaler.update()\n",
                "        scaler.step(optimizer)\n        scaler.update()\n"
                "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
            ),
            codes=("RPM134",),
        ),
        Example(  # near-miss: a plain fp32 step measuring its norm
            "import torch\n\n# no GradScaler here\n\n\ndef step(model, optimizer):\n"
            "    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    optimizer.step()\n    return norm\n",
        ),
    ),
)
