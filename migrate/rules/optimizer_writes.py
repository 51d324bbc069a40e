"""Rule optimizer_writes: main-thread optimizer-state writes are ordered after the running asynchronous step."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="optimizer_writes",
    order=80,
    description="main-thread optimizer-state writes are ordered after the running asynchronous step",
    codes=(),
    implemented_in=("optimizer_writes.py", "steps.py"),
    patterns=(
        Pattern(
            'main-thread writes of optimizer state that may run while an asynchronous step is in flight: `for g in optimizer.param_groups: g["lr"] = ...`, a scheduler step outside the step group, `add_param_group`, `optimizer.load_state_dict`, an `optimizer.zero_grad()` left outside the step function (beside a two-path `if`, before a micro-step loop), a helper given the optimizer (`adjust_learning_rate(optimizer, epoch)`); reads of the scheduler that the step function steps (`scheduler.get_last_lr()` logged after the step), a method of an object built with the optimizer (`policy = WarmupPolicy(optimizer, lr)`, then `policy.step_update(n)`)',
            "`model.synchronize()` right before them, so they run after the running step, as in the original (nothing is added with `--exact`, where the step has finished when `model.step` returns)",
            '异步步骤可能正在运行时、主线程上对优化器状态的写入：`for g in optimizer.param_groups: g["lr"] = ...`、步骤组之外的调度器 step、`add_param_group`、`optimizer.load_state_dict`、留在步骤函数之外的 `optimizer.zero_grad()`（在双路径 `if` 旁、微步循环之前）、接收优化器的辅助函数（`adjust_learning_rate(optimizer, epoch)`）；对由步骤函数推进的调度器的读取（在步骤之后记录 `scheduler.get_last_lr()`）、用优化器构造的对象的方法（`policy = WarmupPolicy(optimizer, lr)` 之后的 `policy.step_update(n)`）',
            "在其前面插入 `model.synchronize()`，使它们像原脚本一样在正在运行的步骤之后执行（`--exact` 下不插入：`model.step` 返回时步骤已经完成）",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        for group in optimizer.param_groups:\n            group["lr"] *= 0.9\n',
            expect=("        model.synchronize()\n        for group in optimizer.param_groups:",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        scheduler.step()\n        optimizer.zero_grad()\n        print(scheduler.get_last_lr())\n',
            expect=(
                "            scheduler.step()\n",
                "        model.synchronize()\n        print(scheduler.get_last_lr())",
            ),
        ),
        Example(
            'import torch\n\n\nclass Policy:\n    def __init__(self, optimizer):\n        self.optimizer = optimizer\n\n    def step_update(self, n):\n        for group in self.optimizer.param_groups:\n            group["lr"] = 0.1 / (1 + n)\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    policy = Policy(optimizer)\n    scaler = torch.amp.GradScaler("cuda")\n    for n, (x, y) in enumerate(batches):\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        policy.step_update(n)\n',
            expect=("        model.synchronize()\n        policy.step_update(n)",),
        ),
        Example(
            'import torch\n\nmodel = torch.nn.Linear(2, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor group in optimizer.param_groups:  # no GradScaler step: nothing to order\n    group["lr"] = 0.01\n',
        ),
    ),
)
