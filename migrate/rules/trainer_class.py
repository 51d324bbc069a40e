"""Rule trainer_class: the scaler, model, optimizer and scheduler held on ``self`` by a trainer class are followed as ``self.scaler``, ``self.model``... through every method of the class."""

from . import Example, Pattern, Rule

_FUSED = """import torch


class Trainer:
    def __init__(self, dim):
        self.model = torch.nn.Linear(dim, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=10)
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, x, y):
        with torch.autocast("cuda"):
            out = self.model(x)
            loss = torch.nn.functional.mse_loss(out, y)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        self.scheduler.step()
        return loss

    def state_dict(self):
        return {"model": self.model.state_dict(), "scaler": self.scaler.state_dict()}


def main(batches):
    trainer = Trainer(8)
    for x, y in batches:
        trainer.train_step(x, y)
    print(trainer.scaler.get_scale())
"""

_AUTOGRAD = """import torch


class Trainer:
    def __init__(self, amp):
        self.net = torch.nn.Linear(8, 1)
        self.opt = torch.optim.AdamW(self.net.parameters())
        self.grad_scaler = torch.amp.GradScaler("cuda") if amp else None

    def step(self, x):
        loss = self.net(x).mean()
        if not torch.isfinite(loss):
            raise FloatingPointError("loss is not finite")
        if self.grad_scaler is not None:
            self.grad_scaler.scale(loss).backward()
            self.grad_scaler.step(self.opt)
            self.grad_scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.opt.zero_grad()
        return loss.item()
"""

_BOUND_TWICE = """import torch


class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(8, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, x):
        self.scaler.scale(self.model(x).mean()).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def close(self):
        self.scaler = None
"""

_USED_OUTSIDE = _FUSED.replace("print(trainer.scaler.get_scale())", "trainer.scaler.update(2.0)")

_ALREADY_MIGRATED = """import roundpipe
import torch


class Trainer:
    def __init__(self):
        self.model = roundpipe.RoundPipe(torch.nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.optim_parameters(), lr=0.1)
        self.scaler = roundpipe.GradScaler("cuda")

    def train_step(self, x):
        loss = self.model(x).mean()
        self.scaler.scale(loss).backward()

        def step_fn():
            self.scaler.step(self.optimizer)
            self.optimizer.zero_grad()

        self.model.step(step_fn)
        self.scaler.update()
"""

_SPLIT_HANDED = """import torch


class BackwardMixin:
    def backward(self, loss):
        self.grad_scaler.scale(loss).backward()


class UpdateMixin:
    def update_params(self):
        self.grad_scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        self.optimizer.zero_grad()


class AMPTrainer(BackwardMixin, UpdateMixin):
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.grad_scaler = torch.amp.GradScaler("cuda")

    def run_step(self, x):
        loss = self.model(x).mean()
        self.backward(loss)
        self.update_params()


def main(batches):
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = AMPTrainer(model, optimizer)
    for x in batches:
        trainer.run_step(x)
"""

_INJECTED_LAZY = """import torch


class Trainer:
    def __init__(self, model, args, optimizer=None, scaler=None):
        self.model = model
        self.args = args
        self.optimizer = optimizer
        self.scaler = scaler or torch.amp.GradScaler("cuda", enabled=args.fp16)

    def create_optimizer(self):
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.lr)

    def training_step(self, model, batch):
        with torch.autocast("cuda", enabled=self.args.fp16):
            loss = model(batch).mean()
        self.scaler.scale(loss).backward()
        return loss.detach()

    def optimizer_step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.model.zero_grad()

    def train(self, batches):
        self.create_optimizer()
        for batch in batches:
            self.training_step(self.model, batch)
            self.optimizer_step()


def main(args, batches):
    model = torch.nn.Linear(8, 1)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    Trainer(model, args, scaler=scaler).train(batches)
"""

_ZEROED_BEFORE_THE_BACKWARD_METHOD = _SPLIT_HANDED.replace(
    "        self.backward(loss)\n", "        self.optimizer.zero_grad()\n        self.backward(loss)\n"
)

_SCALER_FROM_ELSEWHERE = _INJECTED_LAZY.replace(
    "    Trainer(model, args, scaler=scaler).train(batches)\n",
    "    Trainer(model, args, scaler=args.scaler).train(batches)\n",
)

_SPLIT_MIGRATED = """import roundpipe
import torch


class BackwardMixin:
    def backward(self, loss):
        self.grad_scaler.scale(loss).backward()


class UpdateMixin:
    def update_params(self):
        def _step_fn():
            self.grad_scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.optim_parameters(), 1.0)
            self.grad_scaler.step(self.optimizer)
            self.optimizer.zero_grad()

        self.model.step(_step_fn)
        self.grad_scaler.update()


class AMPTrainer(BackwardMixin, UpdateMixin):
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.grad_scaler = roundpipe.GradScaler("cuda")

    def run_step(self, x):
        loss = self.model(x).mean()
        self.backward(loss)
        self.update_params()


def main(batches):
    model = torch.nn.Linear(8, 1)
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=2))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    trainer = AMPTrainer(model, optimizer)
    for x in batches:
        trainer.run_step(x)
"""

RULE = Rule(
    name="trainer_class",
    order=65,
    description=__doc__.split(": ", 1)[1],
    codes=("RPM106", "RPM108", "RPM120"),
    implemented_in=(
        "attributes.py",
        "torch_amp.py",
        "rules/model_wrap.py",
        "model_uses.py",
        "split_step.py",
        "handed_in.py",
        "injected.py",
        "lazy_attributes.py",
        "joined_classes.py",
    ),
    patterns=(
        Pattern(
            "a trainer class: `self.scaler = GradScaler(...)` (or `... if amp else None`), "
            "`self.model = Net()` and `self.optimizer = torch.optim.X(self.model.parameters(), ...)` "
            "in `__init__`, the step in a method, checkpoint methods",
            "followed as `self.scaler`, `self.model`, `self.optimizer` through every method of the "
            "class and of its bases and subclasses in the file, with the rewrites names get "
            "(the model wrapped where `__init__` builds it, `self.model = roundpipe.RoundPipe(Net(), ...)`, "
            "or right before the optimizer when code in between uses it; either form "
            "of the step, `self.model.model.state_dict()`/`load_state_dict()` after "
            "`self.model.synchronize()`); asynchronously, every other method that writes optimizer "
            "state first waits for the running step. Refused (RPM120): an attribute bound more "
            "than once or not by a plain assignment, the optimizer built outside `__init__` or on "
            "a model handed in by the caller, the instance named differently in one method, uses "
            "from outside the class other than `is None` tests, the scaler's "
            "`get_scale`/`state_dict`/`load_state_dict`/`is_enabled` and those of rule instance_outside, a base class of another "
            "file that is not given",
            "训练器类：`__init__` 中的 `self.scaler = GradScaler(...)`（或 `... if amp else None`）、"
            "`self.model = Net()` 和 `self.optimizer = torch.optim.X(self.model.parameters(), ...)`，"
            "训练步骤在某个方法中，另有检查点方法",
            "以 `self.scaler`、`self.model`、`self.optimizer` 的形式，在该类及其同文件中的基类和子类的"
            "所有方法里追踪，改写与普通变量相同（模型在 `__init__` 构建它的地方被包装：`self.model = roundpipe.RoundPipe(Net(), ...)`，"
            "若两者之间有代码使用模型，则在优化器之前包装；"
            "两种步骤形式，在 `self.model.synchronize()` 之后使用 `self.model.model.state_dict()`/"
            "`load_state_dict()`）；异步形式下，其他写优化器状态的方法都会先等待正在运行的步骤。"
            "以下情况被拒绝（RPM120）：属性被绑定多次或不是普通赋值、优化器不在 `__init__` 中构建或构建在"
            "调用者传入的模型上、某个方法用另一个名字称呼实例、在类外除 `is None` 判断、缩放器的 "
            "`get_scale`/`state_dict`/`load_state_dict`/`is_enabled` 以及规则 instance_outside 所处理的使用之外的使用、来自未给出文件的基类",
        ),
        Pattern(
            "the step split over methods (`self.backward(loss)` ending with `self.scaler.scale(loss).backward()`, "
            "`self.update_params()` with unscale/clip/step/update/zero_grad), in mixins of the same file or of "
            "another given file; the model and optimizer handed to the constructor (`Trainer(model, optimizer)`, "
            "`self.model = model`); an optional scaler (`scaler=None`, then `if scaler is None: scaler = "
            "GradScaler(...)`, `scaler or GradScaler()`, `scaler if scaler is not None else GradScaler()`); an "
            "optimizer or scheduler built lazily (`self.optimizer = optimizer` with `None`, then "
            "`if self.optimizer is None: self.optimizer = ...`)",
            "autograd form in the optimizer method: its step group becomes `self.model.step(_step_fn)` + "
            "`self.scaler.update()`, the backward method stays as written; the model is wrapped where the caller "
            "hands it (`model = roundpipe.RoundPipe(model, ...)` before `Trainer(model, ...)` or before its "
            "optimizer); every GradScaler that can reach `self.scaler` (the class's own and the callers') becomes "
            "`roundpipe.GradScaler`; files deriving from or building classes of other given files are analysed "
            "with them as one program. Refused: a `zero_grad` outside the optimizer method (RPM106), a construction "
            "the files do not show or that hands in something else than a name or a call (RPM108), a scaler "
            "handed in that is not followed to a torch GradScaler of the program, or a class built in a file not "
            "given (RPM120)",
            "训练步骤拆分在多个方法中（`self.backward(loss)` 以 `self.scaler.scale(loss).backward()` 结尾，"
            "`self.update_params()` 中做 unscale/裁剪/step/update/zero_grad），位于同一文件或另一个给出文件的 mixin 中；"
            "模型和优化器经构造函数传入（`Trainer(model, optimizer)`、`self.model = model`）；可选的缩放器"
            "（`scaler=None`，然后 `if scaler is None: scaler = GradScaler(...)`、`scaler or GradScaler()`、"
            "`scaler if scaler is not None else GradScaler()`）；延迟构建的优化器或调度器（`self.optimizer = optimizer` "
            "为 `None`，然后 `if self.optimizer is None: self.optimizer = ...`）",
            "优化器方法采用 autograd 形式：其步骤语句变为 `self.model.step(_step_fn)` + `self.scaler.update()`，"
            "反向方法保持原样；模型在调用者传入它的地方被包装（在 `Trainer(model, ...)` 或其优化器之前插入 "
            "`model = roundpipe.RoundPipe(model, ...)`）；所有可能到达 `self.scaler` 的 GradScaler（类自己的和调用者的）"
            "都变为 `roundpipe.GradScaler`；继承或构建其他给出文件中的类的文件与它们作为一个程序一起分析。"
            "以下情况被拒绝：优化器方法之外的 `zero_grad`（RPM106）、文件中看不到的构造或传入的不是名字或调用（RPM108）、"
            "传入的缩放器无法追踪到程序中的 torch GradScaler，或类在未给出的文件中构建（RPM120）",
        ),
    ),
    examples=(
        Example(
            _FUSED,
            expect=(
                "        self.model = roundpipe.RoundPipe(\n"
                "            torch.nn.Linear(dim, 1),\n"
                "            model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH),\n"
                "        )\n",
                "self.optimizer = torch.optim.SGD(self.model.optim_parameters(), lr=0.1)",
                "self.model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)",
                "return self.scaler.scale(loss) / NUM_MICROBATCH",
                "torch.nn.utils.clip_grad_norm_(self.model.optim_parameters(), 1.0)",
                "            self.scheduler.step()\n\n        self.model.step(_step_fn)\n        self.scaler.update()\n",
                '        self.model.synchronize()\n        return {"model": self.model.model.state_dict()',
            ),
        ),
        Example(
            _AUTOGRAD,
            expect=(
                "self.net = roundpipe.RoundPipe(\n            torch.nn.Linear(8, 1),\n",
                "        loss = self.net(x).mean()\n",
                "            self.grad_scaler.scale(loss).backward()\n\n            def _step_fn():\n",
                "            self.net.step(_step_fn)\n            self.grad_scaler.update()\n",
                "            loss.backward()\n\n            def _step_fn_2():\n                self.opt.step()\n",
                "        self.net.synchronize()\n        self.opt.zero_grad()\n",
            ),
        ),
        Example(
            _SPLIT_HANDED,
            expect=(
                "    def backward(self, loss):\n        self.grad_scaler.scale(loss).backward()\n",
                "        def _step_fn():\n            self.grad_scaler.unscale_(self.optimizer)\n"
                "            torch.nn.utils.clip_grad_norm_(self.model.optim_parameters(), 1.0)\n"
                "            self.grad_scaler.step(self.optimizer)\n            self.optimizer.zero_grad()\n\n"
                "        self.model.step(_step_fn)\n        self.grad_scaler.update()\n",
                "    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(",
                "    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)\n",
                "        self.grad_scaler = roundpipe.GradScaler(",
            ),
        ),
        Example(
            _INJECTED_LAZY,
            expect=(
                "        self.scaler = scaler or roundpipe.GradScaler(enabled=args.fp16 and torch.cuda.is_available())\n",
                "    scaler = roundpipe.GradScaler(init_scale=1024.0, enabled=torch.cuda.is_available())\n"
                "    model = roundpipe.RoundPipe(",
                "            self.optimizer = torch.optim.AdamW(self.model.optim_parameters(), lr=self.args.lr)",
                "        def _step_fn():\n            self.scaler.step(self.optimizer)\n"
                "            self.optimizer.zero_grad()\n\n        self.model.step(_step_fn)\n",
            ),
        ),
        Example(_ZEROED_BEFORE_THE_BACKWARD_METHOD, codes=("RPM106",)),
        Example(_SCALER_FROM_ELSEWHERE, codes=("RPM120",)),
        Example(_BOUND_TWICE, codes=("RPM120",)),
        Example(_USED_OUTSIDE, codes=("RPM120",)),
        Example(_ALREADY_MIGRATED),
        Example(_SPLIT_MIGRATED),
    ),
)
