"""Rule loss_function: forward + loss become forward_backward with a loss function holding exactly what the loss depends on."""

from . import Example, Pattern, Rule

#: a torch.amp step of the recognised shape
_PLAIN = 'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n'

RULE = Rule(
    name="loss_function",
    order=30,
    description="forward + loss become forward_backward with a loss function holding exactly what the loss depends on",
    codes=("RPM107", "RPM113", "RPM130", "RPM131", "RPM132", "RPM137"),
    implemented_in=("steps.py",),
    patterns=(
        Pattern(
            "`out = model(inputs)` + the statements computing `loss`",
            "a nested `_loss_fn(out, labels)` with exactly the statements the loss depends on, returning `scaler.scale(loss) / NUM_MICROBATCH`; where the code reads `loss` after the backward, `loss` is then the sum of the unscaled per-microbatch losses the loss function saw (`_losses`; not built when nothing reads it), so it logs the original's value at any scale (dividing the returned scaled sum by `get_scale()` would give inf once loss × scale overflows float32)",
            "`out = model(inputs)` 加上计算 `loss` 的语句",
            "一个嵌套的 `_loss_fn(out, labels)`，只包含损失真正依赖的语句，返回 `scaler.scale(loss) / NUM_MICROBATCH`；若代码在反向传播之后还读取 `loss`，之后 `loss` 是损失函数内看到的各微批次未缩放损失之和（`_losses`；没有代码读取时不生成），因此在任何缩放值下记录的都是原脚本的值（若把返回的已缩放之和除以 `get_scale()`，一旦 loss × scale 超出 float32 范围就会得到 inf）",
        ),
        Pattern(
            "labels",
            "values of this iteration (loop target, assigned in the loop body before the forward, or bound with the model's inputs by a next-batch fetch; function parameters without a loop) that the loss reads become `label=` so microbatching splits them; other values are captured as they are",
            "标签",
            "损失计算读取的、本次迭代的值（循环目标、在循环体中前向传播之前赋值的变量，或由取下一批数据的语句与模型输入一起绑定的变量；没有循环时为函数参数）变为 `label=`，以便按微批次切分；其他值按原样捕获",
        ),
        Pattern(
            "model keyword arguments, `**batch`",
            "`input_kwargs={...}` / `input_kwargs=batch`",
            "模型的关键字参数、`**batch`",
            "`input_kwargs={...}` / `input_kwargs=batch`",
        ),
        Pattern(
            'loss with `reduction="sum"` (in the call or the criterion)',
            "not divided by `NUM_MICROBATCH` (per-microbatch sums already add up)",
            '使用 `reduction="sum"` 的损失（在调用中或在 criterion 中）',
            "不除以 `NUM_MICROBATCH`（各微批次的和本来就能直接相加）",
        ),
        Pattern(
            "outputs used after the step (accuracy)",
            "`return_outputs=True`, the outputs variable keeps its name",
            "在优化器步骤之后使用的输出（如准确率）",
            "`return_outputs=True`，输出变量保持原名",
        ),
        Pattern(
            "`get_scale()` logging, `loss.item()` logging",
            "unchanged",
            "`get_scale()` 日志、`loss.item()` 日志",
            "不变",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        print(loss.item())\n',
            expect=(
                "_losses.append(loss.detach().cpu() / NUM_MICROBATCH)",
                "return scaler.scale(loss) / NUM_MICROBATCH",
                "model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)",
                "loss = sum(_losses)",
            ),
        ),
        Example(  # the loss is not read after the backward: no `_losses` to rebuild it
            _PLAIN,
            expect=(
                "                return scaler.scale(loss) / NUM_MICROBATCH\n\n            model.forward_backward(",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y, reduction="sum")\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=("return scaler.scale(loss)\n",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        print((out.argmax(1) == y).float().mean())\n',
            expect=("return_outputs=True)[1]",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    sum = 0  # a user\'s own `sum`\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        print(loss.item())\n',
            codes=("RPM137",),
        ),
        Example(  # the scaled loss is bound first: not the recognised backward statement
            _PLAIN.replace(
                "        scaler.scale(loss).backward()\n",
                "        scaled = scaler.scale(loss)\n        scaled.backward()\n",
            ),
            codes=("RPM130",),
        ),
        Example(  # backward(inputs=...): no forward_backward form
            _PLAIN.replace(
                "scaler.scale(loss).backward()", "scaler.scale(loss).backward(inputs=list(model.parameters()))"
            ),
            codes=("RPM130",),
        ),
        Example(
            "import torch\n\n# GradScaler mentioned in a comment only; the loss is computed without one\nloss = torch.ones(1).sum()\n",
        ),
    ),
)
