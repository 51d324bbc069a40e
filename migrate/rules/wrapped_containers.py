"""Rule wrapped_containers: the wrapped model indexed, measured or iterated, and its methods that
read no weight, go to the wrapped module (``model.model``)."""

from . import Example, Pattern, Rule

_TRAIN = (
    "import torch\n"
    "import torch.nn as nn\n\n\n"
    "class Net(nn.Sequential):\n"
    "    def __init__(self):\n"
    "        super().__init__(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\n\n"
    "    def parse_batch(self, batch):\n"
    "        return batch\n\n\n"
    "def train(batches):\n"
    "    model = Net()\n"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    '    scaler = torch.amp.GradScaler("cuda")\n'
    "    for batch in batches:\n"
    "        x, y = model.parse_batch(batch)\n"
    "        optimizer.zero_grad()\n"
    '        with torch.autocast("cuda"):\n'
    "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "        scaler.scale(loss).backward()\n"
    "{step}"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
    "        print(len(model), model[-1].weight.norm().item())\n"
)

RULE = Rule(
    name="wrapped_containers",
    order=77,
    description="the wrapped model indexed or iterated, and its weight-free methods, go to the wrapped module",
    codes=("RPM142", "RPM147"),
    implemented_in=("wrapped_containers.py", "weight_free_methods.py", "model_uses.py"),
    patterns=(
        Pattern(
            "after the wrap, the model indexed, measured or iterated outside its step function (`model[-1].weight`, "
            "`len(model)`, `for block in model`, `nn.ReLU() in model`), or a method of the file's model class whose "
            "body never names `self` (`x, y = model.parse_batch(batch)`) where the model is trained",
            "goes to the wrapped module (`model.model[-1].weight`, `len(model.model)`, "
            "`model.model.parse_batch(batch)`), synchronized before where a layer is read after training; a layer "
            "that may run where the model is trained (`model[0](x)`) is refused (RPM147), a layer reached in the "
            "step function or in a statement moved into the loss function too (RPM142)",
            "包装之后，在步骤函数之外对模型取下标、求长度或迭代（`model[-1].weight`、`len(model)`、"
            "`for block in model`、`nn.ReLU() in model`），或在模型被训练处调用本文件模型类中从不引用 `self` 的方法"
            "（`x, y = model.parse_batch(batch)`）",
            "改为作用于被包装的模块（`model.model[-1].weight`、`len(model.model)`、"
            "`model.model.parse_batch(batch)`），训练之后读取某层前先同步；在模型被训练处可能运行的层（`model[0](x)`）"
            "被拒绝（RPM147），在步骤函数中或移入损失函数的语句中取到的层也被拒绝（RPM142）",
        ),
    ),
    examples=(
        Example(
            _TRAIN.format(step=""),
            expect=(
                "        x, y = model.model.parse_batch(batch)\n",
                "        print(len(model.model), model.model[-1].weight.norm().item())\n",
            ),
        ),
        Example(
            _TRAIN.format(
                step="        scaler.unscale_(optimizer)\n"
                "        torch.nn.utils.clip_grad_norm_(model[-1].parameters(), 1.0)\n"
            ),
            codes=("RPM142",),
        ),
        Example(_TRAIN.format(step="").replace("model(x), y", "model[2](model[0](x)), y"), codes=("RPM147",)),
        Example(  # near-miss: no scaler step in the file, so no wrap
            "import torch\n\n\ndef report(model):\n    # GradScaler is not used here\n"
            "    return len(model), model[-1].weight.norm().item()\n"
        ),
    ),
)
