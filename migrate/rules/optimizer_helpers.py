"""Rule optimizer_helpers: an optimizer built by a parameter-group helper is moved onto the
optimizer copies by identity; a training function called for several models wraps each."""

from . import Example, Pattern, Rule

_HELPER = """import torch


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith(".bias") else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def build_optimizer(model, cfg):
    return torch.optim.AdamW(param_groups(model, cfg["wd"]), lr=cfg["lr"])


def train(model, optimizer, scaler, batches):
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def main(cfg, batches):
    student = torch.nn.Linear(4, 2)
    optimizer = build_optimizer(student, cfg)
    scaler = torch.amp.GradScaler("cuda")
    train(student, optimizer, scaler, batches)
    probe = torch.nn.Linear(4, 2)
    probe_scaler = torch.amp.GradScaler("cuda")
    train(probe, build_optimizer(probe, cfg), probe_scaler, batches)
"""

RULE = Rule(
    name="optimizer_helpers",
    order=62,
    description=(
        "an optimizer built by a parameter-group helper is moved onto the optimizer copies by "
        "identity; a training function called for several models wraps each"
    ),
    codes=("RPM107", "RPM108"),
    implemented_in=("optimizer_helpers.py", "origins.py", "rules/model_wrap.py"),
    patterns=(
        Pattern(
            "`optimizer = build_optimizer(model, cfg)`: a helper that groups the parameters by name "
            "(decay/no-decay, layer-wise lr, `named_parameters()` filters) and builds the optimizer, "
            "assigned or written inline as an argument (`train(model, build_optimizer(model, cfg))`), or called "
            "inside the optimizer call (`AdamW(get_params_groups(model))`); "
            "groups built from `model.named_parameters()` inside the optimizer call or by an earlier "
            "statement (`groups = set_weight_decay(model, wd)`; `SGD(groups, ...)`); one optimizer per "
            "branch of an `if`",
            "`model = roundpipe.RoundPipe(model, ...)` before it, then "
            "`model.adopt_optimizer(build_optimizer(model.model, cfg))` (`model.model.named_parameters()` "
            "inside the call; earlier groups are built before the wrap, as written): the helper sees the "
            "module's own names and parameters, and the optimizer moves onto the copies by identity with every "
            "group option (RoundPipe's own `adopt_optimizer`, not in upstream); a helper given no plain "
            "model name, or several, refuses the file (RPM108)",
            "`optimizer = build_optimizer(model, cfg)`：辅助函数按名称给参数分组（衰减/不衰减、逐层学习率、"
            "`named_parameters()` 过滤）并构建优化器，可赋值给变量，也可直接写在实参里"
            "（`train(model, build_optimizer(model, cfg))`），或在优化器调用中调用（`AdamW(get_params_groups(model))`）；在优化器调用内部用 `model.named_parameters()` 分组，"
            "或由之前的语句分组（`groups = set_weight_decay(model, wd)`；`SGD(groups, ...)`）；`if` 的每个分支各建一个优化器",
            "在其前面插入 `model = roundpipe.RoundPipe(model, ...)`，然后改为 "
            "`model.adopt_optimizer(build_optimizer(model.model, cfg))`（调用内部改为 `model.model.named_parameters()`；"
            "之前的分组照原样在包装前构建）：辅助函数看到的是模块自己的名称和参数，"
            "优化器按对象身份移到副本上，保留每个参数组的选项（RoundPipe 自己的 `adopt_optimizer`，上游没有）；"
            "若辅助函数没有得到普通的模型名字，或得到多个，文件被拒绝（RPM108）",
        ),
        Pattern(
            "one training function called for several models, each with its own optimizer",
            "each model is wrapped where its optimizer is built; one model trained through one step "
            "with two optimizers refuses the file (RPM107)",
            "同一个训练函数被多个模型调用，每个模型有自己的优化器",
            "每个模型都在构建其优化器的地方被包装；同一个模型经由同一个步骤用两个优化器训练时，文件被拒绝（RPM107）",
        ),
    ),
    examples=(
        Example(
            _HELPER,
            expect=(
                "    student = roundpipe.RoundPipe(student, model_run_config=",
                "    optimizer = student.adopt_optimizer(build_optimizer(student.model, cfg))\n",
                "    probe = roundpipe.RoundPipe(probe, model_run_config=",
                "    train(probe, probe.adopt_optimizer(build_optimizer(probe.model, cfg)), probe_scaler, batches)\n",
                "        model.step(_step_fn)\n",
            ),
        ),
        Example(  # transformers-style groups from named_parameters(), one optimizer per branch
            "import torch\n\n\ndef train(model, batches, wd, adam):\n"
            '    no_decay = ["bias", "LayerNorm.weight"]\n'
            "    groups = [\n"
            '        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": wd},\n'
            '        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},\n'
            "    ]\n"
            "    if adam:\n        optimizer = torch.optim.AdamW(groups, lr=1e-3)\n"
            "    else:\n        optimizer = torch.optim.SGD(groups, lr=0.1)\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    for x, y in batches:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        optimizer.zero_grad()\n",
            expect=(
                "        optimizer = model.adopt_optimizer(torch.optim.AdamW(groups, lr=1e-3))\n",
                "        optimizer = model.adopt_optimizer(torch.optim.SGD(groups, lr=0.1))\n",
            ),
        ),
        Example(  # a learned loss temperature appended to the groups: not the wrapped module's parameters
            "import torch\n\n\ndef train(model, criterion, batches):\n"
            "    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]\n"
            '    groups = [{"params": decay, "weight_decay": 0.1}]\n'
            '    groups.append({"params": list(criterion.parameters()), "lr": 1e-2})\n'
            "    optimizer = torch.optim.AdamW(groups, lr=1e-3)\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    for x, y in batches:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = criterion(model(x), y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        optimizer.zero_grad()\n",
            codes=("RPM108",),
        ),
        Example(  # DINO-style: the grouping helper called inside the optimizer call
            _HELPER.split("def build_optimizer")[0]
            + "def train(model, optimizer, batches):\n"
            + '    scaler = torch.amp.GradScaler("cuda")\n'
            + "    for x, y in batches:\n"
            + '        with torch.autocast("cuda"):\n'
            + "            loss = model(x).sum()\n"
            + "        scaler.scale(loss).backward()\n"
            + "        scaler.step(optimizer)\n"
            + "        scaler.update()\n\n\n"
            + "def main(cfg, batches):\n"
            + "    student = torch.nn.Linear(4, 2)\n"
            + '    optimizer = torch.optim.AdamW(param_groups(student, cfg["wd"]), lr=cfg["lr"])\n'
            + "    train(student, optimizer, batches)\n",
            expect=(
                '    optimizer = student.adopt_optimizer(torch.optim.AdamW(param_groups(student.model, cfg["wd"]), '
                'lr=cfg["lr"]))\n',
            ),
        ),
        Example(  # one model, two optimizers through the same step
            _HELPER.replace("train(probe, build_optimizer(probe, cfg)", "train(student, build_optimizer(student, cfg)"),
            codes=("RPM107",),
        ),
        Example(  # the helper is not given the model: what it optimizes is unknown
            _HELPER.replace("optimizer = build_optimizer(student, cfg)", "optimizer = build_optimizer(cfg)"),
            codes=("RPM108",),
        ),
        Example(  # near-miss: a helper-built optimizer with no scaler step is left alone
            'import torch\n\n\ndef build(model, cfg):\n    return torch.optim.AdamW(model.parameters(), lr=cfg["lr"])\n\n\n'
            '# GradScaler is not used here\noptimizer = build(torch.nn.Linear(2, 2), {"lr": 0.1})\n',
        ),
    ),
)
