"""``--apex-target plain``: literal apex settings written with upstream RoundPipe's API."""

from __future__ import annotations

from . import Example, Pattern, Rule

_O2 = """import torch
from apex import amp

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
for x, y in [(torch.randn(6, 4), torch.randn(6, 1))]:
    loss = torch.nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
    optimizer.zero_grad()
"""

RULE = Rule(
    name="apex_plain_target",
    order=86,
    description="with --apex-target plain, literal O0/O1/O2/O3 settings become upstream RoundPipe code; others keep compat",
    codes=("RPM303",),
    implemented_in=("apex_plain.py", "apex_amp.py"),
    patterns=(
        Pattern(
            "with `--apex-target plain`: `model, optimizer = amp.initialize(model, optimizer, "
            'opt_level="O0"/"O1"/"O2"/"O3", ...)` with literal `keep_batchnorm_fp32`, `master_weights`, '
            "`loss_scale` (dynamic, or a static power of two), `patch_torch_functions=True` under O1, the "
            "optimizer built on `model.parameters()` before it, each `scale_loss` block followed by its step",
            "no `roundpipe.compat`: where the optimizer is built, `_apex_cast_model(model, dtype, "
            "keep_batchnorm_fp32=...)` (generated after the imports: apex's weight cast, input/output "
            "casts, float32 state dicts) and `model = roundpipe.RoundPipe(model, optim_dtype=...)`; for O1 "
            "the float32 model in `_ApexAutocastRoundPipe` (a generated `roundpipe.RoundPipe` subclass whose "
            "forward and forward_backward run under `torch.autocast`: float16 on CUDA, bfloat16 on the CPU; its "
            "step functions with autocast off) and, where the initialize line was, `_apex_o1_casts()` (the "
            "thread's autocast switched on for the rest of the program, as apex's patches cast code outside "
            "the model); "
            "the optimizer on `model.optim_parameters()`; `amp_scaler = roundpipe.GradScaler(...)` with apex's "
            "scale; `amp.master_params(opt)` becomes the optimizer's parameters; any other file keeps the "
            "compat form with an RPM303 note naming why (docs/apex.md)",
            "使用 `--apex-target plain` 时：`model, optimizer = amp.initialize(model, optimizer, "
            'opt_level="O0"/"O1"/"O2"/"O3", ...)`，覆盖参数 `keep_batchnorm_fp32`、`master_weights`、'
            "`loss_scale`（动态，或 2 的幂的静态值）为字面量，O1 下可有 `patch_torch_functions=True`，"
            "优化器在其之前构建在 `model.parameters()` 上，每个 `scale_loss` 块后紧跟它的步骤",
            "不使用 `roundpipe.compat`：在构建优化器的地方生成 `_apex_cast_model(model, dtype, "
            "keep_batchnorm_fp32=...)`（定义在导入之后：apex 的权重转换、输入/输出转换、float32 状态字典）和 "
            "`model = roundpipe.RoundPipe(model, optim_dtype=...)`；O1 则把 float32 模型放进 "
            "`_ApexAutocastRoundPipe`（生成的 `roundpipe.RoundPipe` 子类，其 forward 与 forward_backward 在 "
            "`torch.autocast` 下运行：CUDA 上 float16，CPU 上 bfloat16；其步骤函数在关闭 autocast 时运行），并在原 "
            "initialize 行处调用 `_apex_o1_casts()`（为程序的其余部分打开本线程的 autocast，就像 apex 的补丁也转换"
            "模型之外的代码）；优化器改用 `model.optim_parameters()`；"
            "`amp_scaler = roundpipe.GradScaler(...)` 使用 apex 的缩放值；`amp.master_params(opt)` 改为优化器的参数；"
            "其他文件保留 compat 形式，并给出说明原因的 RPM303 提示（docs/apex.md）",
        ),
    ),
    examples=(
        Example(
            _O2,
            expect=(
                "_apex_cast_model(model, torch.float16, keep_batchnorm_fp32=True)\nmodel = roundpipe.RoundPipe(",
                "optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)\n",
                "amp_scaler = roundpipe.GradScaler(init_scale=2.0**16, growth_interval=2000)\n",
                '[_param for _group in optimizer.param_groups for _param in _group["params"]]',
            ),
            apex_target="plain",
        ),
        Example(
            _O2.replace('opt_level="O2"', 'opt_level="O1"'),
            expect=(
                "class _ApexAutocastRoundPipe(roundpipe.RoundPipe):\n",
                '    return "cpu", torch.bfloat16\n',
                "model = _ApexAutocastRoundPipe(model, model_run_config=",
                "optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)\n_apex_o1_casts()\n",
                "amp_scaler = roundpipe.GradScaler(init_scale=2.0**16, growth_interval=2000)\n",
            ),
            apex_target="plain",
        ),
        Example(  # a bound upstream's scaler lacks: compat, with an RPM303 note
            _O2.replace('opt_level="O2"', 'opt_level="O1", min_loss_scale=1.0'),
            expect=(
                "model, optimizer = roundpipe.compat.initialize(model, optimizer, "
                'opt_level="O1", min_loss_scale=1.0, verbosity=0)',
            ),
            apex_target="plain",
        ),
        Example(
            _O2.replace("from apex import amp", "from mylib import amp"),
            apex_target="plain",
        ),
    ),
)
