"""Rule inherited_trainer: a trainer base class storing what its ``__init__`` is handed, bound by subclasses through ``super().__init__(...)``, is followed to the subclasses' constructions."""

from . import Example, Pattern, Rule

_DETECTRON2 = """import torch


class SimpleTrainer:
    def __init__(self, model, data_loader, optimizer):
        model.train()
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer

    def run_step(self, data):
        losses = sum(self.model(data).values())
        self.optimizer.zero_grad()
        losses.backward()
        self.optimizer.step()


class AMPTrainer(SimpleTrainer):
    def __init__(self, model, data_loader, optimizer, grad_scaler=None):
        super().__init__(model, data_loader, optimizer)
        if grad_scaler is None:
            grad_scaler = torch.amp.GradScaler("cuda")
        self.grad_scaler = grad_scaler

    def run_step(self, data):
        with torch.autocast("cuda"):
            losses = sum(self.model(data).values())
        self.optimizer.zero_grad()
        self.grad_scaler.scale(losses).backward()
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()

    def train(self):
        for data in self.data_loader:
            self.run_step(data)


def main(loader):
    net = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    AMPTrainer(net, loader, optimizer).train()
"""

_EXPLICIT_KEYWORDS = """import torch


class Base:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer


class Middle(Base):
    pass


class Trainer(Middle):
    def __init__(self, net, opt, amp=True):
        Base.__init__(self, optimizer=opt, model=net)
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step(self, x):
        loss = self.model(x).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()


def main(batches):
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    trainer = Trainer(model, optimizer)
    for x in batches:
        trainer.step(x)
"""

#: the base's plain step runs too: an instance of the base is built
_BASE_BUILT_TOO = _DETECTRON2.replace(
    "    AMPTrainer(net, loader, optimizer).train()\n",
    "    AMPTrainer(net, loader, optimizer).train()\n    SimpleTrainer(net, loader, optimizer).run_step(None)\n",
)

#: the subclass hands the base a model of its own making
_NOT_A_PARAMETER = _DETECTRON2.replace(
    "        super().__init__(model, data_loader, optimizer)\n",
    "        super().__init__(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), data_loader, optimizer)\n",
)

#: the base's __init__ runs only for some instances
_CONDITIONAL_FORWARD = _DETECTRON2.replace(
    "        super().__init__(model, data_loader, optimizer)\n",
    "        if model is not None:\n            super().__init__(model, data_loader, optimizer)\n",
)

#: an unwrapped copy of the handed model is kept
_MODEL_COPIED = _DETECTRON2.replace(
    "        self.grad_scaler = grad_scaler\n",
    "        self.grad_scaler = grad_scaler\n        self.ema = copy.deepcopy(model)\n",
).replace("import torch\n", "import copy\n\nimport torch\n", 1)

#: an isinstance test that the wrapped model would answer differently
_OWN_CLASS_TESTED = _DETECTRON2.replace(
    "        model.train()\n",
    "        if isinstance(model, torch.nn.Linear):\n            print(model.in_features)\n",
)

_MIGRATED = """import roundpipe
import torch


class SimpleTrainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer


class AMPTrainer(SimpleTrainer):
    def __init__(self, model, optimizer):
        super().__init__(model, optimizer)
        self.grad_scaler = roundpipe.GradScaler("cuda")

    def run_step(self, x):
        loss = self.model(x).mean()
        self.grad_scaler.scale(loss).backward()

        def _step_fn():
            self.grad_scaler.step(self.optimizer)
            self.optimizer.zero_grad()

        self.model.step(_step_fn)
        self.grad_scaler.update()


def main(net, batches):
    net = roundpipe.RoundPipe(net)
    trainer = AMPTrainer(net, torch.optim.SGD(net.optim_parameters(), lr=0.1))
    for x in batches:
        trainer.run_step(x)
"""

RULE = Rule(
    name="inherited_trainer",
    order=66,
    description=__doc__.split(": ", 1)[1],
    codes=("RPM108", "RPM115"),
    implemented_in=("inherited_init.py", "overridden.py", "handed_in.py", "origins.py", "model_uses.py"),
    patterns=(
        Pattern(
            "a base trainer whose `__init__(self, model, data_loader, optimizer)` stores what it is handed "
            "(detectron2's `SimpleTrainer`), bound by a subclass through `super().__init__(...)`, "
            "`super(Sub, self).__init__(...)` or `Base.__init__(self, ...)`, positionally or by keyword "
            "(`AMPTrainer.__init__` builds the GradScaler, `run_step` overrides the base's plain step)",
            "`self.model`/`self.optimizer` are followed along each built class's method resolution order "
            "to what its constructions pass (the model wrapped and the optimizer built on its copies there); "
            "the base's plain step, overridden in every class the program builds and never reached through "
            "`super()`, stays as written. Refused (RPM108): a forward under a condition or more than once, "
            "a forwarded value that is not a parameter of the subclass's `__init__`, an `__init__` of a "
            "class the files do not define run before the base's, the handed model used otherwise than "
            "`model.train()`/`eval()`/`isinstance(model, DistributedDataParallel)` (and the body of such an `if`); (RPM115) the base's plain step when an instance of it runs",
            "基础训练器的 `__init__(self, model, data_loader, optimizer)` 保存传入的对象（detectron2 的 "
            "`SimpleTrainer`），由子类通过 `super().__init__(...)`、`super(Sub, self).__init__(...)` 或 "
            "`Base.__init__(self, ...)` 以位置或关键字参数绑定（`AMPTrainer.__init__` 构建 GradScaler，"
            "`run_step` 覆盖基类的普通步骤）",
            "沿每个被构建类的方法解析顺序，把 `self.model`/`self.optimizer` 追踪到其构造处传入的对象（模型在那里"
            "被包装，优化器构建在其副本上）；在程序构建的每个类中都被覆盖且从未经 `super()` 调用的基类普通步骤保持原样。"
            "以下情况被拒绝（RPM108）：条件下或多次转发、转发的值不是子类 `__init__` 的参数、在基类之前运行了未给出文件"
            "中类的 `__init__`、传入的模型除 `model.train()`/`eval()`/`isinstance(model, DistributedDataParallel)`（及此类 `if` 的主体）外另有用途；（RPM115）基类的实例"
            "会运行其普通步骤",
        ),
    ),
    examples=(
        Example(
            _DETECTRON2,
            expect=(
                "    optimizer = torch.optim.SGD(net.optim_parameters(), lr=0.1)\n",
                "    net = roundpipe.RoundPipe(net, model_run_config=roundpipe.RoundPipeRunConfig(",
                "            grad_scaler = roundpipe.GradScaler(",
                "        losses.backward()\n        self.optimizer.step()\n",
                "        def _step_fn():\n            self.grad_scaler.step(self.optimizer)\n",
                "        self.model.step(_step_fn)\n        self.grad_scaler.update()\n",
            ),
        ),
        Example(
            _EXPLICIT_KEYWORDS,
            expect=(
                "    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(",
                "    optimizer = torch.optim.AdamW(model.optim_parameters())\n",
                "        self.scaler = roundpipe.GradScaler(",
            ),
        ),
        Example(_BASE_BUILT_TOO, codes=("RPM115",)),
        Example(_NOT_A_PARAMETER, codes=("RPM108",)),
        Example(_CONDITIONAL_FORWARD, codes=("RPM108",)),
        Example(_MODEL_COPIED, codes=("RPM108",)),
        Example(_OWN_CLASS_TESTED, codes=("RPM108",)),
        Example(_MIGRATED),
    ),
)
