"""Rule wrapped_names: the wrapped model's named parameters, buffers and modules keep the original's names."""

from . import Example, Pattern, Rule

_ACCUMULATE = (
    "import torch\n\n\n"
    "def accumulate(ema, model, decay=0.9):\n"
    "    ema_params = dict(ema.named_parameters())\n"
    "    for name, param in model.named_parameters():\n"
    "        ema_params[name].data.mul_(decay).add_(param.data, alpha=1 - decay)\n\n\n"
    "def train(model, ema, batches):\n"
    "{before}"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    '    scaler = torch.amp.GradScaler("cuda")\n'
    "    for x, y in batches:\n"
    "        optimizer.zero_grad()\n"
    '        with torch.autocast("cuda"):\n'
    "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "        scaler.scale(loss).backward()\n"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
    "        accumulate(ema, model)\n"
)

RULE = Rule(
    name="wrapped_names",
    order=72,
    description="the wrapped model's named parameters, buffers and modules keep the original's names",
    codes=("RPM139",),
    implemented_in=("wrapped_names.py", "model_uses.py"),
    patterns=(
        Pattern(
            "`model.named_parameters()` (`named_buffers`, `named_modules`, `named_children`) on the wrapped model outside the step, also in a function of the file it is handed to (an EMA matched by name: `dict(ema.named_parameters())[name]`)",
            "goes to the wrapped module (`model.model.named_parameters()`): the same tensors under the original's names, not the wrapper's `model.`-prefixed ones; inside a step function it stays (there it yields the optimizer copies); a function also called with a plain module (`accumulate(g_ema, generator, 0)` before the wrap) refuses the file (RPM139)",
            "在步骤之外对被包装模型调用 `model.named_parameters()`（`named_buffers`、`named_modules`、`named_children`），也包括模型被传入的本文件函数中（按名字匹配的 EMA：`dict(ema.named_parameters())[name]`）",
            "改为作用于被包装的模块（`model.model.named_parameters()`）：同样的张量、原程序的名字，而不是包装器带 `model.` 前缀的名字；在步骤函数内保持不变（在那里它给出优化器副本）；同一函数若也以普通模块调用（包装之前的 `accumulate(g_ema, generator, 0)`），文件被拒绝（RPM139）",
        ),
    ),
    examples=(
        Example(
            _ACCUMULATE.format(before=""),
            expect=(
                "    for name, param in model.model.named_parameters():",
                "    ema_params = dict(ema.named_parameters())",
            ),
        ),
        Example(_ACCUMULATE.format(before="    accumulate(ema, model, 0.0)\n"), codes=("RPM139",)),
        Example(
            'import torch\n\n\ndef accumulate(ema, model, scaler: "torch.amp.GradScaler", decay=0.9):  # no step\n'
            "    ema_params = dict(ema.named_parameters())\n"
            "    for name, param in model.named_parameters():\n"
            "        ema_params[name].data.mul_(decay).add_(param.data, alpha=1 - decay)\n"
        ),
    ),
)
