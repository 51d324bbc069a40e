"""Rule method_parameters: an optimizer handed to a trainer's step method (``def train_step(self, batch, optimizer)``) is followed to what every call of the method passes."""

from . import Example, Pattern, Rule

_FROM_THE_CLASS = """import torch


class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(8, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, batch, optimizer):
        with torch.autocast("cuda"):
            loss = self.model(batch).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        self.scaler.update()
        optimizer.zero_grad()
        return loss

    def fit(self, batches):
        for batch in batches:
            self.train_step(batch, self.optimizer)
"""

_FROM_THE_SCRIPT = """import torch


class Trainer:
    def __init__(self, model):
        self.model = model
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, batch, optimizer, max_norm=None):
        with torch.autocast("cuda"):
            loss = self.model(batch).mean()
        optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        if max_norm is not None:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.scaler.step(optimizer)
        self.scaler.update()
        return loss.item()


def main(batches):
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = Trainer(model)
    for batch in batches:
        trainer.train_step(batch, optimizer, max_norm=1.0)
"""

#: two optimizers of one model through one step method
_TWO_OPTIMIZERS = _FROM_THE_CLASS.replace(
    '        self.scaler = torch.amp.GradScaler("cuda")\n',
    '        self.scaler = torch.amp.GradScaler("cuda")\n'
    "        self.finetune = torch.optim.Adam(self.model.parameters())\n",
).replace(
    "            self.train_step(batch, self.optimizer)\n",
    "            self.train_step(batch, self.optimizer)\n            self.train_step(batch, self.finetune)\n",
)

#: a scheduler stepped by the caller after the call waits for the asynchronous step
_SCHEDULED_BY_THE_CALLER = _FROM_THE_SCRIPT.replace(
    "        trainer.train_step(batch, optimizer, max_norm=1.0)\n",
    "        trainer.train_step(batch, optimizer, max_norm=1.0)\n        scheduler.step()\n",
).replace(
    "    trainer = Trainer(model)\n",
    "    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n    trainer = Trainer(model)\n",
)

#: the method handed around as a value: its calls cannot all be seen
_METHOD_AS_VALUE = _FROM_THE_SCRIPT.replace(
    "        trainer.train_step(batch, optimizer, max_norm=1.0)\n",
    "        step = trainer.train_step\n        step(batch, optimizer)\n",
)

_MIGRATED = """import roundpipe
import torch


class Trainer:
    def __init__(self, model):
        self.model = model
        self.scaler = roundpipe.GradScaler("cuda")

    def train_step(self, batch, optimizer):
        loss = self.model(batch).mean()
        self.scaler.scale(loss).backward()

        def _step_fn():
            self.scaler.step(optimizer)
            optimizer.zero_grad()

        self.model.step(_step_fn)
        self.scaler.update()


def main(batches):
    model = roundpipe.RoundPipe(torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)
    trainer = Trainer(model)
    for batch in batches:
        trainer.train_step(batch, optimizer)
"""

RULE = Rule(
    name="method_parameters",
    order=67,
    description=__doc__.split(": ", 1)[1],
    codes=("RPM107", "RPM108"),
    implemented_in=("method_calls.py", "origins.py"),
    patterns=(
        Pattern(
            "the optimizer handed to a trainer's step method: `def train_step(self, batch, optimizer)`, "
            "called as `self.train_step(batch, self.optimizer)` in the class or `trainer.train_step(batch, "
            "optimizer)` by the script (with `trainer = Trainer(...)`)",
            "the parameter is followed to what every call passes, as a function's parameter is (the model "
            "wrapped and the optimizer built on its copies where they are built). Refused (RPM108): the "
            "method's name used other than as a call on an instance of the class (handed around as a value, "
            "named in a string, defined by another class too); (RPM107) the calls hand different optimizers "
            "of one model. Optimizer state a caller writes after the call (`scheduler.step()`) waits for the "
            "asynchronous step (rule optimizer_writes)",
            "传给训练器步骤方法的优化器：`def train_step(self, batch, optimizer)`，在类内以 "
            "`self.train_step(batch, self.optimizer)` 调用，或由脚本以 `trainer.train_step(batch, optimizer)` "
            "调用（`trainer = Trainer(...)`）",
            "与函数参数一样，把该参数追踪到每个调用传入的对象（模型在其构建处包装，优化器构建在其副本上）。"
            "以下情况被拒绝（RPM108）：方法名除了作为该类实例上的调用之外另有用途（被当作值传递、出现在字符串中、"
            "另一个类也定义了同名方法）；（RPM107）各调用为同一个模型传入不同的优化器。调用方在调用之后写优化器状态"
            "（`scheduler.step()`）时先等待异步步骤（规则 optimizer_writes）",
        ),
    ),
    examples=(
        Example(
            _FROM_THE_CLASS,
            expect=(
                "        self.optimizer = torch.optim.SGD(self.model.optim_parameters(), lr=0.1)\n",
                "        def _step_fn():\n            self.scaler.step(optimizer)\n            optimizer.zero_grad()\n",
                "        self.model.step(_step_fn)\n        self.scaler.update()\n",
            ),
        ),
        Example(
            _FROM_THE_SCRIPT,
            expect=(
                "    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(",
                "    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)\n",
                "                torch.nn.utils.clip_grad_norm_(self.model.optim_parameters(), max_norm)\n",
            ),
        ),
        Example(_TWO_OPTIMIZERS, codes=("RPM107",)),
        Example(
            _SCHEDULED_BY_THE_CALLER,
            expect=("        trainer.train_step(batch, optimizer, max_norm=1.0)\n        model.synchronize()\n",),
        ),
        Example(_METHOD_AS_VALUE, codes=("RPM108",)),
        Example(_MIGRATED),
    ),
)
