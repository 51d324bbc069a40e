"""Rule torch_two_path: the backward picked by ``if amp: scaler.scale(loss).backward() else:
loss.backward()``, the optimizer work after that ``if`` (one shared ``scaler.step``, or its own
``if amp: scaler.step(...); scaler.update() else: optimizer.step()``), migrates for both paths.

The step is found after the ``if`` (:mod:`migrate.torch_two_path`). Where the split's test is a
plain read the forward does not bind, the fused form's loss function returns ``(scaler.scale(loss)
if test else loss)``; otherwise (work between the forward and the backward, a test that calls a
function) the autograd form keeps both backwards as written. A two-path step moves whole into the
step function; the update in its AMP branch runs on the main thread after ``model.step``, under the
same test.
"""

from . import Example, Pattern, Rule

_PICKED_TWICE = """import torch


def train(model, criterion, batches, use_amp, clip):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    for x, y in batches:
        with torch.autocast("cuda", enabled=use_amp):
            loss = criterion(model(x), y)
        if use_amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if clip:
            if use_amp:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if use_amp:
            scaler.step(optimizer)
            scaler.update()  # once per iteration
        else:
            optimizer.step()
        optimizer.zero_grad()
"""

_ELSE_FIRST = """import torch


def train(model, batches, use_amp, accum):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cuda", enabled=use_amp):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss = loss / accum
        if not use_amp:
            loss.backward()
        else:
            scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            if not use_amp:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
            optimizer.zero_grad()
"""

_TRAINER = """import math

import torch


class Trainer:
    def __init__(self, model, amp):
        self.amp = amp
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def train_step(self, x, y):
        with torch.autocast("cuda", enabled=self.amp):
            loss = torch.nn.functional.mse_loss(self.model(x), y)
        if not math.isfinite(loss.item()):
            raise FloatingPointError("loss is not finite")
        if self.amp:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()


def main(batches, amp):
    trainer = Trainer(torch.nn.Linear(4, 1), amp)
    for x, y in batches:
        trainer.train_step(x, y)
"""

_MIGRATED = """import roundpipe
import torch


def train(model, batches, use_amp):
    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler(enabled=use_amp)
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if use_amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()

        def _step_fn():
            if use_amp:
                scaler.step(optimizer)
            else:
                optimizer.step()
            optimizer.zero_grad()

        model.step(_step_fn)
        if use_amp:
            scaler.update()
"""

RULE = Rule(
    name="torch_two_path",
    order=58,
    description="the backward picked by `if amp: scaler.scale(loss).backward() else: loss.backward()` "
    "and the optimizer work after that `if` migrate for both paths, fused or in the autograd form",
    codes=("RPM106", "RPM135"),
    implemented_in=("torch_two_path.py", "apex_two_path.py", "rules/loss_function.py"),
    patterns=(
        Pattern(
            "two-path backward: `if amp: scaler.scale(loss).backward()` / `else: loss.backward()` (either "
            "branch first; `if scaler is not None`, `if args.fp16`, `if self.amp`), then the optimizer work "
            "after that `if`: one shared `scaler.step(optimizer); scaler.update()` (the scaler built with "
            "`enabled=amp`) or a two-path step `if amp: [scaler.unscale_(opt); clip...;] scaler.step(opt); "
            "scaler.update()` / `else: [clip...;] opt.step()`, with `if clip: [if amp: scaler.unscale_(opt)] "
            "clip_grad_norm_(...)`, `zero_grad`, gradient accumulation (`if (i + 1) % k == 0:` around it), "
            "a loss divided before the `if`, in a function or a trainer method",
            "fused form where the split's test is a plain read (names, attributes, `len`, "
            "`scaler.is_enabled()`) that the forward does not bind: `_loss_fn` returns "
            "`(scaler.scale(loss) if amp else loss) / NUM_MICROBATCH` and the `if` goes; otherwise the "
            "autograd form, both backwards kept; the optimizer work moves into `_step_fn` for `model.step` "
            "(a two-path step whole, clipping on `model.optim_parameters()`), the AMP branch's update after "
            "it as `if amp: scaler.update()`; a two-path step whose branches hold other work, step different "
            "optimizers, or whose test calls a function or reads a name a loop around it rebinds is refused "
            "(RPM135)",
            "双路径反向：`if amp: scaler.scale(loss).backward()` / `else: loss.backward()`（任一分支在前；"
            "`if scaler is not None`、`if args.fp16`、`if self.amp`），其后是该 `if` 之后的优化器工作："
            "共享的 `scaler.step(optimizer); scaler.update()`（scaler 以 `enabled=amp` 构建），或双路径步骤 "
            "`if amp: [scaler.unscale_(opt); 裁剪...;] scaler.step(opt); scaler.update()` / `else: [裁剪...;] "
            "opt.step()`，以及 `if clip: [if amp: scaler.unscale_(opt)] clip_grad_norm_(...)`、`zero_grad`、"
            "梯度累积（外包 `if (i + 1) % k == 0:`）、在 `if` 之前被除的损失，位于函数或训练器方法中",
            "若拆分的判断只是简单读取（名字、属性、`len`、`scaler.is_enabled()`）且前向不绑定其中的名字，"
            "则采用融合形式：`_loss_fn` 返回 `(scaler.scale(loss) if amp else loss) / NUM_MICROBATCH`，"
            "该 `if` 被移除；否则采用 autograd 形式，两个反向都保持原样；优化器工作移入交给 `model.step` 的 "
            "`_step_fn`（双路径步骤整体移入，裁剪改用 `model.optim_parameters()`），AMP 分支的 update 放在其后，"
            "写作 `if amp: scaler.update()`；若双路径步骤的分支包含其他工作、两个分支步进不同的优化器，"
            "或其判断调用函数、读取被外层循环重新绑定的名字，则拒绝迁移（RPM135）",
        ),
    ),
    examples=(
        Example(
            _PICKED_TWICE,
            expect=(
                "                loss = criterion(_outputs, y)\n"
                "                return (scaler.scale(loss) if use_amp else loss) / NUM_MICROBATCH\n",
                "        def _step_fn():\n            if clip:\n                if use_amp:\n"
                "                    scaler.unscale_(optimizer)\n"
                "                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), clip)\n"
                "            if use_amp:\n                scaler.step(optimizer)\n            else:\n"
                "                optimizer.step()\n            optimizer.zero_grad()\n\n"
                "        model.step(_step_fn)\n        # once per iteration\n"
                "        if use_amp:\n            scaler.update()\n",
            ),
        ),
        Example(
            _ELSE_FIRST,
            expect=(
                "                return (loss if not use_amp else scaler.scale(loss)) / NUM_MICROBATCH\n",
                "        if (i + 1) % accum == 0:\n\n            def _step_fn():\n"
                "                if not use_amp:\n                    optimizer.step()\n"
                "                else:\n                    scaler.step(optimizer)\n"
                "                optimizer.zero_grad()\n\n            model.step(_step_fn)\n"
                "            if use_amp:\n                scaler.update()\n",
            ),
        ),
        Example(
            _TRAINER,
            expect=(
                "        if self.amp:\n            self.scaler.scale(loss).backward()\n"
                "        else:\n            loss.backward()\n\n        def _step_fn():\n"
                "            self.scaler.step(self.optimizer)\n            self.optimizer.zero_grad()\n\n"
                "        self.model.step(_step_fn)\n        self.scaler.update()\n",
            ),
        ),
        Example(  # the split's test calls a function: it stays on the main thread (autograd form)
            _PICKED_TWICE.replace(
                "        if use_amp:\n            scaler.scale", "        if amp_on():\n            scaler.scale"
            ),
            expect=(
                "            loss = criterion(model(x), y)\n        if amp_on():\n"
                "            scaler.scale(loss).backward()\n        else:\n            loss.backward()\n\n"
                "        def _step_fn():\n",
            ),
        ),
        Example(  # the branches step different optimizers
            _PICKED_TWICE.replace("            optimizer.step()\n", "            slow_optimizer.step()\n").replace(
                "    scaler = ", "    slow_optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n    scaler = "
            ),
            codes=("RPM135",),
        ),
        Example(  # the plain branch does more than step: an average that reads the weights
            _PICKED_TWICE.replace(
                "            optimizer.step()\n", "            optimizer.step()\n            ema.update(model)\n"
            ),
            codes=("RPM135",),
        ),
        Example(  # the loop rebinds the flag the step function would read again
            _PICKED_TWICE.replace(
                "    for x, y in batches:\n", "    for x, y in batches:\n        use_amp = x is not None\n"
            ),
            codes=("RPM135",),
        ),
        Example(  # a split backward that nothing steps
            _PICKED_TWICE.split("        if clip:\n")[0],
            codes=("RPM106",),
        ),
        Example(_MIGRATED),  # already in RoundPipe form
    ),
)
