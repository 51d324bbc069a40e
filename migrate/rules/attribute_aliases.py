"""Rule attribute_aliases: a trainer's objects reached through other names (locals of a method,
the constructor's parameter, a scaler built in either branch, a factory given ``self.model``)."""

from . import Example, Pattern, Rule

_LOCALS = """import torch


class Trainer:
    def __init__(self, net, lr):
        self.model = net
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2)
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, x, y):
        model = self.model
        opt, sched = self.opt, self.sched
        scaler = self.scaler
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
        return loss.item()


trainer = Trainer(torch.nn.Linear(4, 2), 0.1)
"""

_CONSTRUCTOR_PARAMETER = """import torch


class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, x):
        with torch.autocast("cuda"):
            loss = self.model(x).sum()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad()


trainer = Trainer(torch.nn.Linear(4, 2))
"""

_BRANCH_SCALERS = """import torch


class AmpWrapper:
    def __init__(self, model, dynamic=True, scale=512.0):
        self.model = torch.nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        if dynamic:
            self.loss_scaler = torch.amp.GradScaler("cuda")
        else:
            self.loss_scaler = torch.amp.GradScaler("cuda", init_scale=scale, growth_interval=10**9)

    def train_step(self, x):
        with torch.autocast("cuda"):
            loss = self.model(x).sum()
        self.loss_scaler.scale(loss).backward()
        self.loss_scaler.step(self.opt)
        self.loss_scaler.update()
        self.opt.zero_grad()
"""

_FACTORY = """import torch


def create_optimizer(args, model):
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    groups = [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}]
    if args.optim == "adamw":
        return torch.optim.AdamW(groups, lr=args.lr)
    return torch.optim.SGD(groups, lr=args.lr, momentum=0.9)


class Trainer:
    def __init__(self, args, model):
        self.model = model
        self.opt = create_optimizer(args, self.model)
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, x):
        with torch.autocast("cuda"):
            loss = self.model(x).sum()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad()


def main(args):
    trainer = Trainer(args, torch.nn.Linear(4, 2))
"""

RULE = Rule(
    name="attribute_aliases",
    order=65,
    description=(
        "a trainer's objects reached through other names: locals of a method bound from its "
        "attributes, the constructor's parameter, a scaler built in either branch of an `if`, "
        "an optimizer factory given `self.model`"
    ),
    codes=("RPM108", "RPM114", "RPM120"),
    implemented_in=(
        "attribute_aliases.py",
        "constructor_alias.py",
        "branch_scalers.py",
        "optimizer_factories.py",
        "optimizer_helpers.py",
        "rules/model_wrap.py",
    ),
    patterns=(
        Pattern(
            "locals of a trainer method bound from its attributes: `optimizer = self.optimizer`, "
            "`opt, sched = self.opt, self.sched`, `scaler = self.scaler`, `model = self.model`, "
            "`model, opt, scaler = self.model, self.opt, self.scaler`, the step "
            "written on the locals; `self.model = model` in `__init__` with the optimizer built on the "
            "constructor's parameter (`self.opt = Adam(model.parameters())`)",
            "followed as the attributes (each local bound once in its method, by a plain assignment): the model "
            "wrapped where the class is built, the step moved into `model.step(_step_fn)` on the locals as written, "
            "main-thread writes of the optimizer in other methods (`self.opt.param_groups`) ordered after the "
            "running step; a local bound again (`optimizer = other`) stays refused (RPM108)",
            "训练器方法中由属性绑定的局部变量：`optimizer = self.optimizer`、`opt, sched = self.opt, self.sched`、"
            "`scaler = self.scaler`、`model = self.model`、`model, opt, scaler = self.model, self.opt, self.scaler`，"
            "训练步骤写在这些局部变量上；`__init__` 中 "
            "`self.model = model` 且优化器构建在构造函数的参数上（`self.opt = Adam(model.parameters())`）",
            "按属性追踪（每个局部变量在其方法中只由一次普通赋值绑定）：模型在构建类的地方被包装，步骤按原样移入 "
            "`model.step(_step_fn)`，其他方法中对优化器的主线程写入（`self.opt.param_groups`）排在运行中的步骤之后；"
            "再次绑定的局部变量（`optimizer = other`）仍被拒绝（RPM108）",
        ),
        Pattern(
            "the scaler built in both branches of an `if` in `__init__` (`if dynamic: self.loss_scaler = "
            "GradScaler() else: self.loss_scaler = GradScaler(init_scale=s, ...)`)",
            "every construction becomes `roundpipe.GradScaler(...)` with its own arguments and the attribute is "
            "followed; a binding outside those branches (`self.loss_scaler = None` in `close()`) or a branch "
            "binding something else stays refused (RPM120)",
            "`__init__` 中 `if` 的两个分支都构建缩放器（`if dynamic: self.loss_scaler = GradScaler() else: "
            "self.loss_scaler = GradScaler(init_scale=s, ...)`）",
            "每个构造都改为带各自参数的 `roundpipe.GradScaler(...)`，并追踪该属性；在这些分支之外的绑定"
            "（`close()` 中的 `self.loss_scaler = None`）或某个分支绑定了别的对象时仍被拒绝（RPM120）",
        ),
        Pattern(
            "an optimizer factory of the file (`build_optimizer(cfg, model)`, `self.opt = create_optimizer(args, "
            "self.model)`) returning `torch.optim.X(...)` on parameter groups, the class chosen by a string "
            '(`if name == "adamw": return AdamW(...)`, `getattr(torch.optim, name)`)',
            "`model.adopt_optimizer(build_optimizer(cfg, model.model))` (a trainer's handed-in model wrapped where "
            "the class is built); a factory that also steps or zeroes, wraps the model, or returns another object "
            "(`Lookahead(...)`, a class of the file, a tuple) is refused (RPM108); a factory of another file or a "
            "library (timm's `create_optimizer_v2`) is adopted the same way, checked at run time; an alias bound before "
            "the wrap without a DDP guard (`model_without_ddp = model`, the optimizer built on it, `model` read after) "
            "is refused (RPM114)",
            "文件中的优化器工厂函数（`build_optimizer(cfg, model)`、`self.opt = create_optimizer(args, self.model)`），"
            '返回基于参数组的 `torch.optim.X(...)`，类可按字符串选择（`if name == "adamw": return AdamW(...)`、'
            "`getattr(torch.optim, name)`）",
            "`model.adopt_optimizer(build_optimizer(cfg, model.model))`（训练器传入的模型在构建类的地方被包装）；"
            "同时执行 step 或清零、包装模型、或返回其他对象（`Lookahead(...)`、文件中的类、元组）的工厂被拒绝（RPM108）；"
            "其他文件或库中的工厂（timm 的 `create_optimizer_v2`）同样被接管，在运行时检查；没有 DDP 守卫时在包装前绑定的别名"
            "（`model_without_ddp = model`，优化器构建在别名上，之后又读取 `model`）被拒绝（RPM114）",
        ),
    ),
    examples=(
        Example(
            _LOCALS,
            expect=(
                "        self.opt = torch.optim.SGD(self.model.optim_parameters(), lr=lr)\n",
                "        def _step_fn():\n            scaler.step(opt)\n            opt.zero_grad()\n            sched.step()\n",
                "trainer = Trainer(\n    roundpipe.RoundPipe(\n",
            ),
        ),
        Example(  # the scaler unpacked with the model and the optimizer
            _LOCALS.replace(
                "        model = self.model\n        opt, sched = self.opt, self.sched\n        scaler = self.scaler\n",
                "        model, opt, scaler = self.model, self.opt, self.scaler\n        sched = self.sched\n",
            ),
            expect=(
                "        model, opt, scaler = self.model, self.opt, self.scaler\n",
                "        def _step_fn():\n            scaler.step(opt)\n            opt.zero_grad()\n            sched.step()\n",
            ),
        ),
        Example(
            _CONSTRUCTOR_PARAMETER,
            expect=(
                "        self.opt = torch.optim.Adam(model.optim_parameters(), lr=1e-3)\n",
                "        self.model.step(_step_fn)\n",
                "trainer = Trainer(\n    roundpipe.RoundPipe(\n",
            ),
        ),
        Example(
            _BRANCH_SCALERS,
            expect=(
                "            self.loss_scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())\n",
                "            self.loss_scaler = roundpipe.GradScaler(\n                init_scale=scale,\n",
            ),
        ),
        Example(
            _FACTORY,
            expect=(
                "        self.opt = self.model.adopt_optimizer(create_optimizer(args, self.model.model))\n",
                "    trainer = Trainer(\n        args,\n        roundpipe.RoundPipe(\n",
            ),
        ),
        Example(  # the local is bound again: which optimizer it holds at the step is not certain
            _LOCALS.replace(
                "        scaler = self.scaler\n",
                "        scaler = self.scaler\n        if x is None:\n            opt = None\n",
            ),
            codes=("RPM108",),
        ),
        Example(  # the scaler attribute is also bound outside the branches
            _BRANCH_SCALERS + "\n    def close(self):\n        self.loss_scaler = None\n",
            codes=("RPM120",),
        ),
        Example(  # a factory that also zeroes what it builds
            _FACTORY.replace(
                "        return torch.optim.AdamW(groups, lr=args.lr)\n",
                "        optimizer = torch.optim.AdamW(groups, lr=args.lr)\n        optimizer.zero_grad()\n        return optimizer\n",
            ),
            codes=("RPM108",),
        ),
        Example(  # a factory returning an object of the file that holds the optimizer
            "class Holder:\n    def __init__(self, opt):\n        self.opt = opt\n\n\n"
            + _FACTORY.replace(
                "        return torch.optim.AdamW(groups, lr=args.lr)\n",
                "        return Holder(torch.optim.AdamW(groups, lr=args.lr))\n",
            ),
            codes=("RPM108",),
        ),
        Example(  # `model_without_ddp = model` before the wrap, no DDP guard: `model` stays unwrapped
            "import torch\n\n\ndef train(batches):\n    model = torch.nn.Linear(4, 2)\n    model_without_ddp = model\n"
            "    optimizer = torch.optim.SGD(model_without_ddp.parameters(), lr=0.1)\n"
            '    scaler = torch.amp.GradScaler("cuda")\n    for x in batches:\n'
            '        with torch.autocast("cuda"):\n            loss = model(x).sum()\n'
            "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n"
            "        optimizer.zero_grad()\n",
            codes=("RPM114",),
        ),
        Example(  # near-miss: a trainer without a scaler step, its locals left alone
            "import torch\n\n\nclass Trainer:\n    def __init__(self, model):\n        self.model = model\n"
            "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
            "    def train_step(self, x):\n        opt = self.opt  # no GradScaler here\n"
            "        self.model(x).sum().backward()\n        opt.step()\n",
        ),
    ),
)
