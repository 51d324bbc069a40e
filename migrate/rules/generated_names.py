"""Rule generated_names: the roundpipe header goes into the top import block; generated names are fresh."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="generated_names",
    order=90,
    description="the roundpipe header goes into the top import block; generated names are fresh",
    codes=(),
    implemented_in=("header.py", "plan.py"),
    patterns=(
        Pattern(
            "generated names (`NUM_MICROBATCH`, `_loss_fn`, `_step_fn`, `_losses`, ...)",
            "fresh: a name the file already uses gets a suffix (`NUM_MICROBATCH_2`); `import roundpipe` is sorted into the top import block (where isort or ruff would put it, before any module code) and is not repeated; `NUM_MICROBATCH = 1` follows the block",
            "生成的名字（`NUM_MICROBATCH`、`_loss_fn`、`_step_fn`、`_losses` 等）",
            "总是新名字：文件里已用过的名字会加后缀（`NUM_MICROBATCH_2`）；`import roundpipe` 按排序插入顶部导入块（即 isort 或 ruff 会放的位置，在任何模块代码之前），且不会重复；`NUM_MICROBATCH = 1` 紧随该导入块",
        ),
    ),
    examples=(
        Example(
            '"""Docstring."""\nimport torch\n\nNUM_MICROBATCH = 8\nimport math  # a late import\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                '"""Docstring."""\nimport roundpipe\nimport torch\n\nNUM_MICROBATCH_2 = 1',
                "num_microbatch=NUM_MICROBATCH_2",
            ),
        ),
        Example(
            "import roundpipe\nimport torch\n\nNUM_MICROBATCH = 1  # GradScaler already migrated by hand\n",
        ),
    ),
)
