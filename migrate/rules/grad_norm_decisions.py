"""Rule grad_norm_decisions: an ``if`` that reads a gradient norm measured in the step and
chooses what the step does (skip on a non-finite norm, count and log the skip) moves into the
step function with the measure."""

from . import Example, Pattern, Rule

_SKIP = """import torch


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    skipped = 0
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        if not torch.isfinite(grad_norm):
            print(f"grad norm {grad_norm}: skipping")
            skipped += 1
            scaler.step(optimizer)
            scaler.update()
        else:
            scaler.step(optimizer)
            scaler.update()  # the scale grows or backs off here
        optimizer.zero_grad()
    return skipped
"""

_FINITE_ONLY = """import math

import torch


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if math.isfinite(norm.item()):
            scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""

RULE = Rule(
    name="grad_norm_decisions",
    order=53,
    description="an `if` reading a gradient norm measured in the step chooses what the step does",
    codes=("RPM135",),
    implemented_in=("step_decisions.py", "step_values.py", "rules/step_function.py"),
    patterns=(
        Pattern(
            "`norm = clip_grad_norm_(...)` then `if not torch.isfinite(norm): log; skipped += 1; "
            "scaler.step(opt); scaler.update() else: scaler.step(opt); scaler.update()`, or "
            "`if math.isfinite(norm.item()): scaler.step(opt)` before `scaler.update()`",
            "the `if` moves into the step function with the measure (the norm exists only there); a "
            "`scaler.update()` ending every branch runs once after `model.step`; names its branches "
            "bind become `nonlocal`; logging or counters there make the step synchronous "
            "(`is_async=False`) so they run at their place in the iteration. A branch with "
            "`continue`/`break`/`return`/`raise`, a loop, or an update in only some branches refuses "
            "the file (RPM135, naming that statement)",
            "`norm = clip_grad_norm_(...)` 之后 `if not torch.isfinite(norm): 记录日志; skipped += 1; "
            "scaler.step(opt); scaler.update() else: scaler.step(opt); scaler.update()`，或在 "
            "`scaler.update()` 之前 `if math.isfinite(norm.item()): scaler.step(opt)`",
            "该 `if` 与范数计算一起移入步骤函数（范数只在那里存在）；各分支末尾都有的 "
            "`scaler.update()` 在 `model.step` 之后执行一次；分支中绑定的名字声明为 `nonlocal`；"
            "分支中的日志或计数使步骤同步执行（`is_async=False`），使其在迭代中的位置不变。分支中含 "
            "`continue`/`break`/`return`/`raise`、循环，或只有部分分支调用 update 时，文件被拒绝"
            "（RPM135，并指出该语句）",
        ),
    ),
    examples=(
        Example(
            _SKIP,
            expect=(
                "        def _step_fn():\n"
                "            nonlocal skipped\n"
                "            scaler.unscale_(optimizer)\n"
                "            grad_norm = torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 5.0)\n"
                "            if not torch.isfinite(grad_norm):\n"
                '                print(f"grad norm {grad_norm}: skipping")\n'
                "                skipped += 1\n"
                "                scaler.step(optimizer)\n"
                "            else:\n"
                "                scaler.step(optimizer)\n"
                "            optimizer.zero_grad()\n"
                "\n"
                "        model.step(_step_fn, is_async=False)\n"
                "        # the scale grows or backs off here\n"
                "        scaler.update()\n",
            ),
        ),
        Example(  # only optimizer work in the `if`: the step stays asynchronous
            _FINITE_ONLY,
            expect=(
                "            if math.isfinite(norm.item()):\n                scaler.step(optimizer)\n"
                "            optimizer.zero_grad()\n\n        model.step(_step_fn)\n        scaler.update()\n",
            ),
        ),
        Example(  # a skip with `continue` leaves the loop iteration: it cannot move
            _FINITE_ONLY.replace(
                "        if math.isfinite(norm.item()):\n            scaler.step(optimizer)\n",
                "        if not math.isfinite(norm.item()):\n            continue\n        scaler.step(optimizer)\n",
            ),
            codes=("RPM135",),
        ),
        Example(  # the update in one branch only: the scale would not be updated every iteration
            _FINITE_ONLY.replace(
                "            scaler.step(optimizer)\n        scaler.update()\n",
                "            scaler.step(optimizer)\n            scaler.update()\n",
            ),
            codes=("RPM135",),
        ),
        Example(  # near-miss: an fp32 step skipped on a non-finite norm
            "import math\n\nimport torch\n\n# no GradScaler here\n\n\ndef step(model, optimizer):\n"
            "    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "    if math.isfinite(norm.item()):\n        optimizer.step()\n",
        ),
    ),
)
