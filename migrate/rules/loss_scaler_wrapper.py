"""Rule loss_scaler_wrapper: a loss-scaler wrapper class (MAE/BEiT/DeiT/timm's `NativeScaler`) migrates with every file that builds or calls it; the wrapper keeps its interface and steps its RoundPipe model in the autograd form."""

from . import Example, Pattern, Rule

_GRAD_NORM_WRAPPER = """import torch


def get_grad_norm_(parameters, norm_type=2.0):
    parameters = [p for p in parameters if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type) for p in parameters]), norm_type)


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if update_grad:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale the gradients in place
                norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            else:
                self._scaler.unscale_(optimizer)
                norm = get_grad_norm_(parameters)
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            norm = None
        return norm

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)


def main(model, loader, accum_iter):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_scaler = NativeScalerWithGradNormCount()
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum_iter
        update = (step + 1) % accum_iter == 0
        norm = loss_scaler(loss, optimizer, parameters=model.parameters(), update_grad=update)
        if update:
            optimizer.zero_grad()
            print(norm.item())
    torch.save({"model": model.state_dict(), loss_scaler.state_dict_key: loss_scaler.state_dict()}, "ckpt.pth")
"""

_TIMM_WRAPPER = """import torch


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self, device="cuda"):
        self._scaler = torch.amp.GradScaler(device)

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False, need_update=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if need_update:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_value_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()


def train(model, loader, use_amp):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_scaler = NativeScaler() if use_amp else None
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())
        else:
            loss.backward()
            optimizer.step()
"""

_EARLY_RETURN = _GRAD_NORM_WRAPPER.replace(
    """        if update_grad:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale the gradients in place
                norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            else:
                self._scaler.unscale_(optimizer)
                norm = get_grad_norm_(parameters)
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            norm = None
        return norm
""",
    """        if not update_grad:
            return None
        self._scaler.unscale_(optimizer)
        norm = get_grad_norm_(parameters)
        self._scaler.step(optimizer)
        self._scaler.update()
        return norm
""",
)

_ALREADY_MIGRATED = """import roundpipe
import torch


class ScalerWithGradNorm:
    def __init__(self, *, model):
        self._model = model
        self._scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())

    def __call__(self, loss, optimizer, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            def _step_fn():
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, 1.0)
                self._scaler.step(optimizer)
            self._model.step(_step_fn)
            self._scaler.update()


def train(model, loader):
    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    loss_scaler = ScalerWithGradNorm(model=model)
    for x, y in loader:
        loss_scaler(torch.nn.functional.mse_loss(model(x), y), optimizer, parameters=model.optim_parameters())
"""

_TIMM_IMPORTED = """import torch
from timm.utils import ApexScaler, NativeScaler


def train(model, loader, clip_grad):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_scaler = NativeScaler()
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss_scaler(loss, optimizer, clip_grad=clip_grad, parameters=model.parameters())
"""

# fairseq-style: an optimizer-like class owning the scaler, its methods called in turn.
RULE = Rule(
    name="loss_scaler_wrapper",
    order=47,
    description="a loss-scaler wrapper class (MAE/BEiT/DeiT/timm's `NativeScaler`) migrates with every file "
    "that builds or calls it; the wrapper keeps its interface and steps its RoundPipe model in the autograd form",
    codes=("RPM111",),
    implemented_in=("scaler_wrapper.py", "project.py"),
    patterns=(
        Pattern(
            "a class holding `self._scaler = GradScaler(...)` whose `__call__(loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True)` runs `self._scaler.scale(loss).backward(...)`, then on update steps (`if update_grad:` or after an early `return`) `unscale_`, clipping or a grad-norm helper, `self._scaler.step(optimizer)`, `self._scaler.update()`, and may return the norm; `state_dict_key`/`state_dict`/`load_state_dict`",
            "the class keeps its interface and state: `__init__` takes the RoundPipe model as a keyword-only `model` argument, the scaler becomes `roundpipe.GradScaler`, the backward stays on the main thread as written, the optimizer work moves into `_step_fn` for `self._model.step` (waited for with `--exact`, and always when `__call__` returns what the step computed, e.g. the norm) and `update()` stays after it; where it is built, the model is wrapped before its optimizer, which takes `model.optim_parameters()`, and the construction gets `model=model`; a class of this kind with any other `__call__`, or built where no optimizer on `model.parameters()` is built, is refused (RPM111)",
            "一个持有 `self._scaler = GradScaler(...)` 的类，其 `__call__(loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True)` 执行 `self._scaler.scale(loss).backward(...)`，在更新步骤（`if update_grad:` 内或提前 `return` 之后）执行 `unscale_`、裁剪或梯度范数辅助函数、`self._scaler.step(optimizer)`、`self._scaler.update()`，并可返回范数；带有 `state_dict_key`/`state_dict`/`load_state_dict`",
            "该类保持接口和状态不变：`__init__` 以仅限关键字的参数 `model` 接收 RoundPipe 模型，缩放器改为 `roundpipe.GradScaler`，反向仍按原样在主线程上执行，优化器相关的工作移入 `_step_fn` 交给 `self._model.step`（使用 `--exact` 时同步等待；`__call__` 返回步骤中计算的值（如范数）时也总是等待），`update()` 留在其后；在构造它的地方，模型在其优化器之前被包装，优化器改用 `model.optim_parameters()`，构造调用加上 `model=model`；此类中 `__call__` 为其他形式、或在没有基于 `model.parameters()` 构建优化器的地方构造时，拒绝迁移（RPM111）",
        ),
        Pattern(
            "timm's wrapper imported from timm (`from timm.utils import NativeScaler`, also `timm.utils.cuda`): `loss_scaler = NativeScaler()`",
            "`loss_scaler = roundpipe.compat.NativeScaler(model=model)` (`is_async=False` with `--exact`), RoundPipe's drop-in with timm's interface; the timm import of it goes when nothing else uses it; its calls as below",
            "从 timm 导入的 timm 包装类（`from timm.utils import NativeScaler`，也包括 `timm.utils.cuda`）：`loss_scaler = NativeScaler()`",
            "`loss_scaler = roundpipe.compat.NativeScaler(model=model)`（使用 `--exact` 时加 `is_async=False`），即接口与 timm 相同的 RoundPipe 替代类；若其他地方不再使用，则删除对它的 timm 导入；其调用按下一行处理",
        ),
        Pattern(
            "`loss_scaler(loss, optimizer, ..., parameters=model.parameters(), ...)` calls, in any given file (the instance passed to training functions of other files); checkpoint helpers of other files given the model",
            "`parameters=model.optim_parameters()`; a helper of another file that only saves or loads the model's state gets `model.model` after `model.synchronize()`; a plain `loss.backward(); optimizer.step()` branch beside an optional wrapper takes the autograd form too; in the asynchronous form, a main-thread write of the optimizer's state in the caller makes it wait for the step right after the call; `parameters=` given anything else, or more than `(loss, optimizer)` by position, is refused (RPM111)",
            "任意给定文件中的 `loss_scaler(loss, optimizer, ..., parameters=model.parameters(), ...)` 调用（实例可被传给其他文件的训练函数）；把模型交给其他文件中的检查点辅助函数",
            "改为 `parameters=model.optim_parameters()`；其他文件中只保存或加载模型状态的辅助函数改为接收 `model.model`，并在其前插入 `model.synchronize()`；可选包装器旁边的普通 `loss.backward(); optimizer.step()` 分支同样采用 autograd 形式；异步形式下，若调用方在主线程上写优化器状态，则在调用之后立即等待该步骤完成；`parameters=` 为其他表达式、或按位置传入多于 `(loss, optimizer)` 的参数时，拒绝迁移（RPM111）",
        ),
    ),
    examples=(
        Example(
            _TIMM_IMPORTED,
            expect=(
                "from timm.utils import ApexScaler\n",
                "    loss_scaler = roundpipe.compat.NativeScaler(model=model)\n",
                "        loss_scaler(loss, optimizer, clip_grad=clip_grad, parameters=model.optim_parameters())\n"
                "        model.synchronize()\n",
            ),
        ),
        Example(
            _GRAD_NORM_WRAPPER,
            expect=(
                "    def __init__(self, *, model):\n        self._model = model\n"
                "        self._scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())\n",
                "        self._scaler.scale(loss).backward(create_graph=create_graph)\n        if update_grad:\n"
                "\n            def _step_fn():\n                nonlocal norm\n                if clip_grad is not None:\n",
                "                self._scaler.step(optimizer)\n\n            self._model.step(_step_fn, is_async=False)\n"
                "            self._scaler.update()\n        else:\n            norm = None\n        return norm\n",
                "    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)\n"
                "    loss_scaler = NativeScalerWithGradNormCount(model=model)\n",
                "parameters=model.optim_parameters(), update_grad=update)",
                '"model": model.model.state_dict()',
            ),
        ),
        Example(
            _TIMM_WRAPPER,
            expect=(
                "            def _step_fn_2():\n                if clip_grad is not None:\n",
                "            self._model.step(_step_fn_2)\n            self._scaler.update()\n",
                "    loss_scaler = NativeScaler(model=model) if use_amp else None\n",
                "            loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.optim_parameters())\n"
                "        else:\n            loss.backward()\n\n            def _step_fn():\n"
                "                optimizer.step()\n\n            model.step(_step_fn)\n        model.synchronize()\n",
            ),
        ),
        Example(
            _EARLY_RETURN,
            expect=(
                "        if not update_grad:\n            return None\n        norm = None\n"
                "\n        def _step_fn():\n            nonlocal norm\n            self._scaler.unscale_(optimizer)\n",
            ),
        ),
        Example(_ALREADY_MIGRATED),
        Example(
            _GRAD_NORM_WRAPPER.replace(
                "        self._scaler.scale(loss).backward(create_graph=create_graph)\n",
                "        loss = loss * self.loss_weight\n        self._scaler.scale(loss).backward(create_graph=create_graph)\n",
            ),
            codes=("RPM111",),
        ),
        Example(
            _GRAD_NORM_WRAPPER.replace("    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n", "").replace(
                "def main(model, loader, accum_iter):", "def main(model, optimizer, loader, accum_iter):"
            ),
            codes=("RPM111",),
        ),
        Example(
            _GRAD_NORM_WRAPPER.replace(
                "parameters=model.parameters(), update_grad", "parameters=model.head.parameters(), update_grad"
            ),
            codes=("RPM111",),
        ),
    ),
)
