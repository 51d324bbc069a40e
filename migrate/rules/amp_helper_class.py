"""Rule amp_helper_class: an AMP helper class with separate methods (`scale_loss`/`backward`, `unscale`, `optimizer_step`, `update`, the scaler's state) migrates with every file that builds or calls it; each method keeps its interface, the unscale and step methods step the RoundPipe model in the autograd form."""

from . import Example, Pattern, Rule

_HELPER = """import torch


class AMPScaler:
    def __init__(self, enabled=True, scaler=None):
        self.scaler = scaler or torch.cuda.amp.GradScaler(enabled=enabled)

    def scale_loss(self, loss):
        return self.scaler.scale(loss)

    def unscale(self, optimizer):
        self.scaler.unscale_(optimizer)  # before clipping

    def optimizer_step(self, optimizer):
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self):
        return self.scaler.state_dict()

    def load_state_dict(self, state_dict):
        self.scaler.load_state_dict(state_dict)


def train(model, loader, max_norm):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = AMPScaler()
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        amp.scale_loss(loss).backward()
        amp.unscale(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        amp.optimizer_step(optimizer)
    torch.save({"model": model.state_dict(), "amp": amp.state_dict()}, "ckpt.pth")
"""

_INJECTED = """import logging

import torch

logger = logging.getLogger(__name__)


class AmpHelper:
    def __init__(self, scaler=None):
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler("cuda")

    def backward(self, loss):
        logger.debug("scale %s", self.scaler.get_scale())
        self.scaler.scale(loss).backward()

    def step(self, optimizer):
        self.scaler.step(optimizer)

    def update(self):
        self.scaler.update()


def fit(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = AmpHelper(scaler=torch.amp.GradScaler("cuda", init_scale=1024.0))
    for x, y in batches:
        amp.backward(torch.nn.functional.mse_loss(model(x), y))
        amp.step(optimizer)
        amp.update()
        optimizer.zero_grad()
"""

_CLIPPING_STEP = """import torch


class GradScalerWrapper:
    def __init__(self):
        self.scaler = torch.cuda.amp.GradScaler()

    def scale(self, loss):
        return self.scaler.scale(loss)

    def step(self, optimizer, clip_grad=None, parameters=None):
        if clip_grad is not None:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self.scaler.step(optimizer)
        self.scaler.update()


def train(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = GradScalerWrapper()
    for x, y in loader:
        wrapper.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        wrapper.step(optimizer, clip_grad=1.0, parameters=model.parameters())
"""

_ALREADY_MIGRATED = """import roundpipe
import torch


class AMPScaler:
    def __init__(self, enabled=True, scaler=None, *, model):
        self._model = model
        self.scaler = scaler or roundpipe.GradScaler(enabled=enabled)

    def scale_loss(self, loss):
        return self.scaler.scale(loss)

    def optimizer_step(self, optimizer):
        def _step_fn():
            self.scaler.step(optimizer)

        self._model.step(_step_fn)
        self.scaler.update()


def train(model, loader):
    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    amp = AMPScaler(model=model)
    for x, y in loader:
        amp.scale_loss(torch.nn.functional.mse_loss(model(x), y)).backward()
        amp.optimizer_step(optimizer)
"""

RULE = Rule(
    name="amp_helper_class",
    order=47,
    description="an AMP helper class with separate methods (`scale_loss`/`backward`, `unscale`, `optimizer_step`, "
    "`update`, the scaler's state) migrates with every file that builds or calls it; the unscale and step methods "
    "step the RoundPipe model in the autograd form",
    codes=("RPM111",),
    implemented_in=("amp_helper_class.py", "scaler_wrapper.py", "project.py"),
    patterns=(
        Pattern(
            "a class without `__call__` storing one GradScaler in `__init__` (`self.scaler = GradScaler(...)`, or handed in: `scaler or GradScaler(...)`, `scaler if scaler is not None else GradScaler(...)`) whose methods each do one thing: `return self.scaler.scale(loss)`, `self.scaler.scale(loss).backward()`, `self.scaler.unscale_(optimizer)`, `self.scaler.step(optimizer)` (perhaps then `self.scaler.update()`), `self.scaler.update()`, the scaler's state methods; a step method may also take the clipping arguments (`step(optimizer, clip_grad=None, parameters=None)`: `unscale_` and clipping under `if`s, then `step`, perhaps `update()`)",
            "the class keeps its interface: `__init__` takes the RoundPipe model as a keyword-only `model`, the scaler becomes `roundpipe.GradScaler`; the scale and backward methods stay on the main thread as written (autograd form); the unscale method runs `unscale_` in `self._model.step(_step_fn, is_async=False)` (always waited for: callers clip the unscaled gradients on the main thread), the step method runs `step` (with its unscaling and clipping) in `self._model.step(...)` (waited for with `--exact`) and keeps `update()` after it; logging that reads only its arguments and the scale is kept in methods that stay on the main thread; any other statement in a method, two scalers, a base class: refused (RPM111)",
            "一个没有 `__call__` 的类，在 `__init__` 中保存一个 GradScaler（`self.scaler = GradScaler(...)`，或由外部传入：`scaler or GradScaler(...)`、`scaler if scaler is not None else GradScaler(...)`），其每个方法只做一件事：`return self.scaler.scale(loss)`、`self.scaler.scale(loss).backward()`、`self.scaler.unscale_(optimizer)`、`self.scaler.step(optimizer)`（其后可有 `self.scaler.update()`）、`self.scaler.update()`、缩放器的状态方法；step 方法也可接收裁剪参数（`step(optimizer, clip_grad=None, parameters=None)`：在 `if` 下执行 `unscale_` 与裁剪，然后 `step`，其后可有 `update()`）",
            "该类保持接口不变：`__init__` 以仅限关键字的参数 `model` 接收 RoundPipe 模型，缩放器改为 `roundpipe.GradScaler`；缩放与反向方法按原样留在主线程上（autograd 形式）；unscale 方法在 `self._model.step(_step_fn, is_async=False)` 中执行 `unscale_`（总是等待：调用方在主线程上裁剪未缩放的梯度），step 方法在 `self._model.step(...)` 中执行 `step`（连同其中的 unscale 与裁剪；使用 `--exact` 时等待），其后保留 `update()`；只读取其参数和缩放值的日志语句在留在主线程的方法中保留；方法中的其他任何语句、两个缩放器、带基类的类：拒绝迁移（RPM111）",
        ),
        Pattern(
            "where it is built and called, in any given file: `amp = AMPScaler(scaler=GradScaler(...))` or `AMPScaler()`; `amp.scale_loss(loss).backward()` / `amp.backward(loss)`; `amp.unscale(optimizer)`, clipping of `model.parameters()`, `amp.optimizer_step(optimizer)` (or `amp.step(optimizer, clip_grad=c, parameters=model.parameters())`); `optimizer.zero_grad()`",
            "the model is wrapped before its optimizer, which takes `model.optim_parameters()`, and so does a step call's `parameters` argument (any other reading of a model's parameters given to it is refused); the construction gets `model=model` and a GradScaler built in its arguments becomes `roundpipe.GradScaler`; between `amp.unscale(optimizer)` and the helper's step in the same block, clipping takes `model.optim_parameters()` (anything else reading the model's parameters or `.grad` there is refused, RPM111); `model.zero_grad()` follows `optimizer.zero_grad()`; in the asynchronous form a main-thread write of the optimizer's state in the caller waits for the step (`model.synchronize()` after the step call); an instance used other than by calling its methods, a scaler built elsewhere handed to the construction (`AMPScaler(scaler=scaler)`), or an unscale call with no step after it in its block or around its `if`: refused (RPM111)",
            "在任意给定文件中构造与调用它的地方：`amp = AMPScaler(scaler=GradScaler(...))` 或 `AMPScaler()`；`amp.scale_loss(loss).backward()` / `amp.backward(loss)`；`amp.unscale(optimizer)`、对 `model.parameters()` 的裁剪、`amp.optimizer_step(optimizer)`（或 `amp.step(optimizer, clip_grad=c, parameters=model.parameters())`）；`optimizer.zero_grad()`",
            "模型在其优化器之前被包装，优化器改用 `model.optim_parameters()`，step 调用的 `parameters` 参数也如此（传给它的其他模型参数读取拒绝迁移）；构造调用加上 `model=model`，在其参数中构造的 GradScaler 改为 `roundpipe.GradScaler`；同一代码块中 `amp.unscale(optimizer)` 与其后该类的 step 调用之间，裁剪改用 `model.optim_parameters()`（在此读取模型参数或 `.grad` 的其他代码拒绝迁移，RPM111）；`optimizer.zero_grad()` 之后加上 `model.zero_grad()`；异步形式下，调用方在主线程上写优化器状态时先等待该步骤（在 step 调用之后插入 `model.synchronize()`）；除调用其方法之外以其他方式使用实例、把在别处构造的缩放器交给构造调用（`AMPScaler(scaler=scaler)`）、或 unscale 调用之后在同一代码块或其外层 `if` 之后没有 step 调用：拒绝迁移（RPM111）",
        ),
    ),
    examples=(
        Example(
            _HELPER,
            expect=(
                "    def __init__(self, enabled=True, scaler=None, *, model):\n        self._model = model\n"
                "        self.scaler = scaler or roundpipe.GradScaler(enabled=enabled and torch.cuda.is_available())\n",
                "    def unscale(self, optimizer):\n        def _step_fn():\n"
                "            self.scaler.unscale_(optimizer)  # before clipping\n\n"
                "        self._model.step(_step_fn, is_async=False)\n",
                "        def _step_fn_2():\n            self.scaler.step(optimizer)\n\n"
                "        self._model.step(_step_fn_2)\n        self.scaler.update()\n",
                "    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)\n"
                "    amp = AMPScaler(model=model)\n",
                "        optimizer.zero_grad()\n        model.zero_grad()\n",
                "        amp.scale_loss(loss).backward()\n        amp.unscale(optimizer)\n"
                "        torch.nn.utils.clip_grad_norm_(model.optim_parameters(), max_norm)\n"
                "        amp.optimizer_step(optimizer)\n        model.synchronize()\n",
                '"model": model.model.state_dict()',
            ),
        ),
        Example(
            _INJECTED,
            expect=(
                "        self.scaler = scaler if scaler is not None else roundpipe.GradScaler(",
                '        logger.debug("scale %s", self.scaler.get_scale())\n        self.scaler.scale(loss).backward()\n',
                "    amp = AmpHelper(scaler=roundpipe.GradScaler(init_scale=1024.0, enabled=torch.cuda.is_available()), "
                "model=model)\n",
                "        amp.step(optimizer)\n        model.synchronize()\n        amp.update()\n",
            ),
        ),
        Example(
            _CLIPPING_STEP,
            expect=(
                "    def step(self, optimizer, clip_grad=None, parameters=None):\n        def _step_fn():\n"
                "            if clip_grad is not None:\n",
                "            self.scaler.step(optimizer)\n\n        self._model.step(_step_fn)\n        self.scaler.update()\n",
                "        wrapper.step(optimizer, clip_grad=1.0, parameters=model.optim_parameters())\n",
            ),
        ),
        Example(_ALREADY_MIGRATED),
        # a step method given parameters that are not the model's own
        Example(
            _CLIPPING_STEP.replace("parameters=model.parameters())", "parameters=model.head.parameters())"),
            codes=("RPM111",),
        ),
        # a method that does more than its scaler call
        Example(
            _HELPER.replace(
                "        self.scaler.update()\n", "        self.scaler.update()\n        self.steps = self.steps + 1\n"
            ),
            codes=("RPM111",),
        ),
        # logging in a method that would run on the optimizer thread
        Example(
            _HELPER.replace(
                "        self.scaler.step(optimizer)\n", '        print("step")\n        self.scaler.step(optimizer)\n'
            ),
            codes=("RPM111",),
        ),
        # two scalers in one helper
        Example(
            _HELPER.replace(
                "        self.scaler = scaler or torch.cuda.amp.GradScaler(enabled=enabled)\n",
                "        self.scaler = scaler or torch.cuda.amp.GradScaler(enabled=enabled)\n"
                "        self.aux_scaler = torch.cuda.amp.GradScaler(enabled=enabled)\n",
            ),
            codes=("RPM111",),
        ),
        # the caller reads the model's gradients between the unscale and the step
        Example(
            _HELPER.replace(
                "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n",
                "        grads = [p.grad for p in model.parameters()]\n",
            ),
            codes=("RPM111",),
        ),
        # the instance's scaler used directly
        Example(
            _HELPER.replace("        amp.optimizer_step(optimizer)\n", "        amp.scaler.step(optimizer)\n"),
            codes=("RPM111",),
        ),
    ),
)
