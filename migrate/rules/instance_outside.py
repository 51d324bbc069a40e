"""Rule instance_outside: a trainer's model and optimizer used through an instance outside its class get the class's own treatment, through the instance."""

from . import Example, Pattern, Rule

_TRAINER = """import torch


class Trainer:
    def __init__(self, dim):
        self.model = torch.nn.Linear(dim, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, x, y):
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()


def main(batches, path):
    trainer = Trainer(8)
    for x, y in batches:
        trainer.train_step(x, y)
    USE
"""

RULE = Rule(
    name="instance_outside",
    order=68,
    description=__doc__.split(": ", 1)[1],
    codes=("RPM120",),
    implemented_in=("instance_outside.py", "attributes.py", "model_uses.py", "project.py"),
    patterns=(
        Pattern(
            "the code driving a trainer class (in the class's file or another given file) uses its model or "
            "optimizer through an instance it builds (`trainer = Trainer(...)`): "
            '`trainer.optimizer.param_groups[0]["lr"]` read or written, `trainer.optimizer.state_dict()`, '
            "`trainer.model.parameters()`, `trainer.model.state_dict()`, `trainer.model.eval()`, "
            "`trainer.model(x)`, `evaluate(trainer.model, loader)`",
            "what the same use gets inside the class, through the instance: the model's state through the "
            "wrapped module (`trainer.model.model.state_dict()`, `named_parameters()` likewise), "
            "`trainer.model.synchronize()` before a checkpoint or an evaluation and, asynchronously, before "
            "a read of the weights after training and before each statement touching the optimizer's state "
            "(nothing inside a training loop, one step stale as in the class); a function of the file the "
            "model is handed to is followed into. Refused (RPM120): an instance "
            "reached through a container, a parameter, another name or `getattr(trainer, name)`, the model "
            "stored or bound to another name, any other optimizer use (`trainer.optimizer.step()`, a condition reading "
            "its lr)",
            "驱动训练器类的代码（在类所在的文件或另一个给定文件中）通过自己构造的实例"
            "（`trainer = Trainer(...)`）使用其模型或优化器：读或写 "
            '`trainer.optimizer.param_groups[0]["lr"]`、`trainer.optimizer.state_dict()`、'
            "`trainer.model.parameters()`、`trainer.model.state_dict()`、`trainer.model.eval()`、"
            "`trainer.model(x)`、`evaluate(trainer.model, loader)`",
            "通过实例得到与类内同样使用相同的处理：模型状态经由被包装的模块"
            "（`trainer.model.model.state_dict()`，`named_parameters()` 同理），"
            "在检查点或评估之前插入 `trainer.model.synchronize()`；异步形式下，训练之后对权重的读取之前、"
            "以及每条涉及优化器状态的语句之前也插入（训练循环内不插入，与类内一样滞后一步）；"
            "模型被交给文件中的函数时，跟踪进入该函数。"
            "以下情况被拒绝（RPM120）：经由容器、参数、另一个名字或 `getattr(trainer, name)` 得到的实例、"
            "模型被存储或绑定到另一个名字、优化器的其他使用（`trainer.optimizer.step()`、读取学习率的条件）",
        ),
    ),
    examples=(
        Example(
            _TRAINER.replace(
                "    USE\n",
                '    lr = trainer.optimizer.param_groups[0]["lr"]\n'
                '    torch.save({"model": trainer.model.state_dict(), "opt": trainer.optimizer.state_dict()}, path)\n'
                '    trainer.optimizer.param_groups[0]["lr"] = lr / 10\n',
            ),
            expect=(
                '    trainer.model.synchronize()\n    lr = trainer.optimizer.param_groups[0]["lr"]\n',
                '{"model": trainer.model.model.state_dict(), "opt": trainer.optimizer.state_dict()}',
            ),
        ),
        Example(
            _TRAINER.replace("    USE\n", "    print(sum(p.sum() for p in trainer.model.parameters()))\n"),
            expect=("    trainer.model.synchronize()\n    print(sum(p.sum() for p in trainer.model.parameters()))\n",),
        ),
        Example(
            _TRAINER.replace("    USE\n", '    runs = [trainer]\n    print(runs[0].optimizer.param_groups[0]["lr"])\n'),
            codes=("RPM120",),
        ),
        Example(
            _TRAINER.replace("    USE\n", '    print(getattr(trainer, "optimizer").param_groups[0]["lr"])\n'),
            codes=("RPM120",),
        ),
        Example(
            "import torch\nfrom torch import amp\n\n\nclass Evaluator:\n    def __init__(self, model):\n        self.model = model\n"
            "        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n\n    def predict(self, x):\n"
            '        with amp.autocast("cuda"):\n            return self.model(x)\n\n\ndef main(x):\n'
            "    evaluator = Evaluator(torch.nn.Linear(2, 2))\n"
            '    print(evaluator.predict(x), evaluator.optimizer.param_groups[0]["lr"])  # no scaler step to wait for\n'
        ),
    ),
)
