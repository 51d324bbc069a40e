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

RULE = Rule(
    name="trainer_class",
    order=65,
    description=__doc__.split(": ", 1)[1],
    codes=("RPM120",),
    implemented_in=("attributes.py", "torch_amp.py", "steps.py", "model_uses.py"),
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
            "from outside the class other than `is None` tests and the scaler's "
            "`get_scale`/`state_dict`/`load_state_dict`/`is_enabled`, a base class of another "
            "file (mixins)",
            "训练器类：`__init__` 中的 `self.scaler = GradScaler(...)`（或 `... if amp else None`）、"
            "`self.model = Net()` 和 `self.optimizer = torch.optim.X(self.model.parameters(), ...)`，"
            "训练步骤在某个方法中，另有检查点方法",
            "以 `self.scaler`、`self.model`、`self.optimizer` 的形式，在该类及其同文件中的基类和子类的"
            "所有方法里追踪，改写与普通变量相同（模型在 `__init__` 构建它的地方被包装：`self.model = roundpipe.RoundPipe(Net(), ...)`，"
            "若两者之间有代码使用模型，则在优化器之前包装；"
            "两种步骤形式，在 `self.model.synchronize()` 之后使用 `self.model.model.state_dict()`/"
            "`load_state_dict()`）；异步形式下，其他写优化器状态的方法都会先等待正在运行的步骤。"
            "以下情况被拒绝（RPM120）：属性被绑定多次或不是普通赋值、优化器不在 `__init__` 中构建或构建在"
            "调用者传入的模型上、某个方法用另一个名字称呼实例、在类外除 `is None` 判断和缩放器的 "
            "`get_scale`/`state_dict`/`load_state_dict`/`is_enabled` 之外的使用、来自其他文件的基类（mixin）",
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
        Example(_BOUND_TWICE, codes=("RPM120",)),
        Example(_USED_OUTSIDE, codes=("RPM120",)),
        Example(_ALREADY_MIGRATED),
    ),
)
