"""Rule two_path_accumulation: both paths of a two-path step accumulate under one condition."""

from . import Example, Pattern, Rule

_BOTH = """import torch


def train(model, batches, use_amp, accum):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cuda", enabled=use_amp):
            loss = torch.nn.functional.mse_loss(model(x), y) / accum
        if use_amp:
            scaler.scale(loss).backward()
            if (i + 1) % accum == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        else:
            loss.backward()
            if (i + 1) % accum == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
"""

RULE = Rule(
    name="two_path_accumulation",
    order=56,
    description="both paths of a two-path step accumulate under one condition",
    codes=("RPM136",),
    implemented_in=("same_condition.py", "plain_path.py"),
    patterns=(
        Pattern(
            "`if amp: scaler.scale(loss).backward(); if <cond>: ...scaler.step...` beside "
            "`else: loss.backward(); if <cond>: ...optimizer.step()` (gradient accumulation on both paths)",
            "each step becomes `model.step(_step_fn)` under its `if <cond>:` as written, when the two conditions "
            "are the same text, call nothing but `len` and read no name rebound between the backward and the "
            "`if`; otherwise, or with a `zero_grad()` before the plain backward, the file is refused (RPM136)",
            "`if amp: scaler.scale(loss).backward(); if <cond>: ...scaler.step...` 与 "
            "`else: loss.backward(); if <cond>: ...optimizer.step()`（两条路径都做梯度累积）",
            "两个步骤都在各自原样保留的 `if <cond>:` 下变为 `model.step(_step_fn)`，前提是两个条件文本相同、只调用 `len`、"
            "且不读取在反向与 `if` 之间被重新绑定的名字；否则，或普通路径的反向之前有 `zero_grad()`，拒绝该文件（RPM136）",
        ),
    ),
    examples=(
        Example(
            _BOTH,
            expect=(
                "            if (i + 1) % accum == 0:\n\n"
                "                def _step_fn_2():\n"
                "                    torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)\n"
                "                    optimizer.step()\n"
                "                    optimizer.zero_grad()\n\n"
                "                model.step(_step_fn_2)\n",
            ),
        ),
        Example(  # the plain path steps on other iterations than the AMP path
            _BOTH.replace(
                "            loss.backward()\n            if (i + 1) % accum == 0:",
                "            loss.backward()\n            if i % accum == 0:",
            ),
            codes=("RPM136",),
        ),
        Example(  # the condition's name is rebound between the plain backward and its `if`
            _BOTH.replace("            loss.backward()\n", "            loss.backward()\n            accum = 1\n"),
            codes=("RPM136",),
        ),
        Example(  # near-miss: accumulation without a scaler
            "import torch\n\n# no GradScaler here\n\n\ndef train(model, batches, accum):\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    for i, (x, y) in enumerate(batches):\n"
            "        torch.nn.functional.mse_loss(model(x), y).backward()\n"
            "        if (i + 1) % accum == 0:\n            optimizer.step()\n            optimizer.zero_grad()\n",
        ),
    ),
)
