"""Rule generated_layout: generated code is laid out as a formatter would, so a linted, formatted file stays so."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="generated_layout",
    order=95,
    description="generated code is laid out as a formatter would, so a linted, formatted file stays so",
    codes=(),
    implemented_in=("header.py", "layout.py", "wrapping.py"),
    patterns=(
        Pattern(
            "a generated line longer than 120 columns (a `forward_backward` call with many arguments, a user's line an edit made longer)",
            "wrapped as black and ruff format wrap it: the outermost call or display on the line split one element per line, with a trailing comma; a line of the original file is never rewrapped",
            "超过 120 列的生成代码行（参数很多的 `forward_backward` 调用、被改写变长的用户代码行）",
            "按 black 和 ruff format 的方式折行：把该行最外层的调用或字面量拆成每行一个元素，并带结尾逗号；原文件中的行从不重新折行",
        ),
        Pattern(
            "blank lines around `_loss_fn` / `_step_fn`",
            "as a formatter puts them (one before and after a nested function); a block whose first statement was removed does not open with a blank line",
            "`_loss_fn` / `_step_fn` 周围的空行",
            "与格式化工具一致（嵌套函数前后各一个空行）；首条语句被移除的代码块不会以空行开头",
        ),
    ),
    examples=(
        Example(
            'import os\n\nimport numpy as np\nimport torch\nfrom torch import nn\n\nimport mylib\n\n\ndef train(model: nn.Module, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for inputs, attention_mask, labels in batches:\n        with torch.autocast("cuda"):\n            logits = model(inputs, attention_mask=attention_mask)\n            loss = torch.nn.functional.cross_entropy(logits, labels)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        print(loss.item(), logits.shape, os.getpid(), np.pi, mylib)\n',
            expect=(
                "import os\n\nimport numpy as np\nimport roundpipe\nimport torch\nfrom torch import nn\n\nimport mylib\n\nNUM_MICROBATCH = 1",
                '        with torch.autocast("cuda"):\n\n            def _loss_fn(logits, labels):\n',
                "                return scaler.scale(loss) / NUM_MICROBATCH\n\n            _losses = []\n",
                '            logits = model.forward_backward(\n                input_args=(inputs,),\n                input_kwargs={"attention_mask": attention_mask},\n                label=labels,\n                loss_fn=_loss_fn,\n                return_outputs=True,\n            )[1]\n',
                "            optimizer.zero_grad()\n\n        model.step(_step_fn)\n",
            ),
        ),
        Example(
            "import torch\n\nscaler = None  # no GradScaler here: this script trains in float32, and this comment runs on well past the 120th column\n",
        ),
    ),
)
