"""Rule apex_extras: ``amp.initialize`` results held on ``self``, and apex's pieces beside
``amp.initialize``/``scale_loss`` (fused optimizers, SyncBN, DDP, function casting), migrate to
their torch or ``roundpipe.compat`` forms."""

from . import Example, Pattern, Rule

_SCRIPT = """import os

import torch
from apex import amp
from apex.optimizers import FusedAdam
from apex.parallel import DistributedDataParallel as DDP
from apex.parallel import convert_syncbn_model


@amp.float_function
def stable_loss(logits, targets):
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)


def train(model, batches):
    amp.register_float_function(torch, "sigmoid")
    model = convert_syncbn_model(model)
    optimizer = FusedAdam(model.parameters(), 1e-3, weight_decay=0.01)  # AdamW's rule
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        model = DDP(model, delay_allreduce=True)
    for x, y in batches:
        loss = stable_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""

_HEAD = (
    "import torch\nfrom apex import amp\nfrom apex.optimizers import {optimizer}\n\n\n"
    "def train(model, batches):\n"
    "    optimizer = {optimizer}(model.parameters(){arguments})\n"
    '    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")\n'
    "    for x, y in batches:\n"
    "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
    "            scaled_loss.backward()\n"
    "        optimizer.step()\n"
    "        optimizer.zero_grad()\n"
)

_HELD = """import torch
from apex import amp


class Learner:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O2")

    def fit(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.item()

    def save(self):
        return {"model": self.model.state_dict(), "amp": amp.state_dict()}
"""

RULE = Rule(
    name="apex_extras",
    order=85,
    description="amp.initialize results held on self; apex's fused optimizers, SyncBN, DDP and function casting move with amp",
    codes=("RPM101", "RPM201"),
    implemented_in=("apex_extras.py", "apex_attributes.py", "apex_amp.py"),
    patterns=(
        Pattern(
            "`self.model, self.optimizer = amp.initialize(self.model, self.optimizer, ...)` (or of locals unused "
            "after it) in a method of a class",
            "`roundpipe.compat.initialize(...)`; the step on `self.model`/`self.optimizer` in the class's methods migrates as any apex step; other uses of them in the class may only read or load state dicts or switch train/eval: `self.model.synchronize()` before, the model's state dict through `self.model.model`; a use through another object (`learner.model`), a nested function or a subclass refuses the file (RPM201) naming it; so does a local alias of the model in the step (`model = self.model`)",
            "类的方法中的 `self.model, self.optimizer = amp.initialize(self.model, self.optimizer, ...)`"
            "（或其参数为此后不再使用的局部变量）",
            "改为 `roundpipe.compat.initialize(...)`；类方法中基于 `self.model`/`self.optimizer` 的训练步骤按普通 apex 步骤迁移；类中对它们的其他使用只能读取或加载状态字典、切换 train/eval：在其前插入 `self.model.synchronize()`，模型的状态字典改经 `self.model.model`；通过其他对象（`learner.model`）、嵌套函数或子类的使用会使文件被拒绝（RPM201），并指明位置；训练步骤中模型的局部别名（`model = self.model`）同样如此",
        ),
        Pattern(
            "apex `FusedAdam`/`FusedSGD`/`FusedAdagrad(...)`",
            "`torch.optim.AdamW` (`Adam` for `adam_w_mode=False`) with `fused=True`, `SGD`/`Adagrad` with `foreach=True`, every argument as a keyword of the same meaning, `set_grad_none` dropped (torch's `zero_grad` sets None); same update rule, another kernel; `bias_correction=False`, `amsgrad=True`, `master_weights=True`, `wd_after_momentum=True`, `materialize_master_grads=False`, `adagrad_w_mode=True` and `FusedLAMB`/`FusedNovoGrad` refuse the file (RPM201)",
            "apex 的 `FusedAdam`/`FusedSGD`/`FusedAdagrad(...)`",
            "`torch.optim.AdamW`（`adam_w_mode=False` 时为 `Adam`）加 `fused=True`，`SGD`/`Adagrad` 加 `foreach=True`；每个参数改为含义相同的关键字参数，去掉 `set_grad_none`（torch 的 `zero_grad` 本就置为 None）；更新规则相同，内核不同；`bias_correction=False`、`amsgrad=True`、`master_weights=True`、`wd_after_momentum=True`、`materialize_master_grads=False`、`adagrad_w_mode=True` 以及 `FusedLAMB`/`FusedNovoGrad` 会使文件被拒绝（RPM201）",
        ),
        Pattern(
            "`apex.parallel.convert_syncbn_model(model)`; `model = apex.parallel.DistributedDataParallel(model)` alone under `if <distributed>:`",
            "`torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` (`channel_last=True`: RPM201); the guarded DDP line becomes `raise RuntimeError(...)` (RoundPipe trains in one process), an unguarded one refuses the file (RPM101)",
            "`apex.parallel.convert_syncbn_model(model)`；单独位于 `if <分布式>:` 之下的 `model = apex.parallel.DistributedDataParallel(model)`",
            "`torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`（`channel_last=True`：RPM201）；受条件保护的 DDP 行改为 `raise RuntimeError(...)`（RoundPipe 在单进程中训练），不受保护的会使文件被拒绝（RPM101）",
        ),
        Pattern(
            "`@amp.float_function`/`half_function`/`bfloat16_function`/`promote_function`, `amp.register_*_function(module, name)`",
            "their `roundpipe.compat` twins, with apex's semantics: under O1 only, the floating tensor arguments are cast (float32; O1's low-precision type, bfloat16 on CPU; float32 for mixed types) and O1's casting stays on inside; registrations apply at the next O1 `initialize`. Not `torch.amp.custom_fwd(cast_inputs=...)`: that one turns autocast off inside the function and writes onto its first argument",
            "`@amp.float_function`/`half_function`/`bfloat16_function`/`promote_function`、`amp.register_*_function(module, name)`",
            "改为 `roundpipe.compat` 中的同名函数，语义与 apex 相同：仅在 O1 下转换浮点张量参数（float32；O1 的低精度类型，CPU 上为 bfloat16；类型混合时为 float32），函数内部 O1 的转换仍然生效；注册在下一次 O1 `initialize` 时生效。不改为 `torch.amp.custom_fwd(cast_inputs=...)`：它会在函数内部关闭 autocast，并向第一个参数写入属性",
        ),
    ),
    examples=(
        Example(
            _HELD,
            expect=(
                "        amp_scaler = roundpipe.compat.loss_scaler()\n\n        def _loss_fn(",
                "        self.model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)\n",
                "        self.model.step(_step_fn)\n",
                '        self.model.synchronize()\n        return {"model": self.model.model.state_dict(), '
                '"amp": roundpipe.compat.state_dict()}',
            ),
        ),
        Example(_HELD + "\n\ndef report(learner):\n    print(learner.model)\n", codes=("RPM201",)),
        Example(
            _HELD.replace("amp.initialize(self.model, self.optimizer,", "amp.initialize(model, self.optimizer,"),
            codes=("RPM201",),
        ),
        Example(
            _HELD.replace(
                "        self.model = model\n        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
                "        self.model, self.optimizer = amp.initialize(self.model, self.optimizer,",
                "        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                "        self.model, self.optimizer = amp.initialize(model, optimizer,",
            ),
            expect=("roundpipe.compat.initialize(model, optimizer, ", "        self.model.step(_step_fn)\n"),
        ),
        Example(
            _HELD.replace("mse_loss(self.model(x), y)", "mse_loss(model(x), y)").replace(
                "    def fit(self, x, y):\n", "    def fit(self, x, y):\n        model = self.model\n"
            ),
            codes=("RPM201",),
        ),
        Example(
            _SCRIPT,
            expect=(
                "@roundpipe.compat.float_function\ndef stable_loss(",
                '    roundpipe.compat.register_float_function(torch, "sigmoid")\n',
                "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n",
                "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)"
                "  # AdamW's rule\n",
                "> 1:\n        raise RuntimeError(",
            ),
        ),
        Example(
            _HEAD.format(optimizer="FusedSGD", arguments=", 0.1, 0.9, nesterov=True, set_grad_none=True"),
            expect=("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, foreach=True)",),
        ),
        Example(
            _HEAD.format(optimizer="FusedAdam", arguments=", adam_w_mode=False"),
            expect=("torch.optim.Adam(model.parameters(), fused=True)",),
        ),
        Example(_HEAD.format(optimizer="FusedLAMB", arguments=", lr=1e-3"), codes=("RPM201",)),
        Example(_HEAD.format(optimizer="FusedAdam", arguments=", bias_correction=False"), codes=("RPM201",)),
        Example(
            _SCRIPT.replace(
                '    if int(os.environ.get("WORLD_SIZE", "1")) > 1:\n        model = DDP(', "    model = DDP("
            ),
            codes=("RPM101",),
        ),
        Example(
            "import torch\n\n\ndef describe(model):\n"
            '    return f"{model} (apex.optimizers.FusedAdam and amp.float_function are not used)"\n'
        ),
    ),
)
