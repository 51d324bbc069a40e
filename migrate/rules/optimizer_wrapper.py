"""Rule optimizer_wrapper: an optimizer wrapper class owning the GradScaler (fairseq's AMP optimizers) migrates with every file that builds it; each method keeps its interface and is migrated by what it does (backward on the caller's thread, gradient work in its own `model.step`)."""

from . import Example, Pattern, Rule

_WRAPPER = """import torch


class AmpOptimizer:
    def __init__(self, params, lr):
        self.params = list(params)
        self.optimizer = torch.optim.Adam(self.params, lr=lr)
        self.scaler = torch.amp.GradScaler("cuda")

    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def clip_grad_norm(self, max_norm):
        self.scaler.unscale_(self.optimizer)
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def zero_grad(self):
        self.optimizer.zero_grad()

    def set_lr(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self):
        state = self.optimizer.state_dict()
        state["loss_scaler"] = self.scaler.state_dict()
        return state


def train(model, batches):
    optimizer = AmpOptimizer(model.parameters(), lr=1e-3)
    for x, y in batches:
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.backward(loss)
        norm = optimizer.clip_grad_norm(1.0)  # logged below
        optimizer.step()
        print(norm.item())
"""

_HANDED_OPTIMIZER = """import torch


class AmpOptimizer:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._scaler = torch.amp.GradScaler("cuda")

    def backward(self, loss):
        self._scaler.scale(loss).backward()

    def step(self, max_norm=None):
        if max_norm is not None:
            self._scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]], max_norm)
        self._scaler.step(self.optimizer)
        self._scaler.update()

    def zero_grad(self):
        self.optimizer.zero_grad()


def train(model, batches):
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = AmpOptimizer(base)
    scheduler = torch.optim.lr_scheduler.StepLR(base, step_size=10)
    for x, y in batches:
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.backward(loss)
        optimizer.step(max_norm=1.0)
        scheduler.step()
"""

RULE = Rule(
    name="optimizer_wrapper",
    order=48,
    description="an optimizer wrapper class owning the GradScaler (fairseq's AMP optimizers) migrates with "
    "every file that builds it; each method keeps its interface and is migrated by what it does",
    codes=("RPM106", "RPM111"),
    implemented_in=("optimizer_wrapper_class.py", "optimizer_wrappers.py", "scaler_wrapper.py", "project.py"),
    patterns=(
        Pattern(
            "a class holding `self.scaler = GradScaler(...)` next to the optimizer it wraps, behind an optimizer's "
            "interface the training loop calls in turn (fairseq's AMP optimizers): `backward(loss)` "
            "(`self.scaler.scale(loss).backward(...)`), gradient methods (`multiply_grads(c)`, "
            "`clip_grad_norm(c)` returning the norm, `step()` ending with `self.scaler.update()`), `zero_grad()`, "
            "`get_lr`/`set_lr`, `state_dict`/`load_state_dict` with the scaler's state under a key",
            "the class keeps its interface: `__init__` takes the RoundPipe model as a keyword-only `model` "
            "argument and the scaler becomes `roundpipe.GradScaler`; `backward` stays on the caller's thread as "
            "written (autograd form); each gradient method (also one handing the optimizer's parameters to a helper "
            "or looping over them, as a grad-norm method does) has its body become a `_step_fn` for its own "
            "`self._model.step` (waited for with `--exact`, and always when the method returns a value, e.g. the "
            "norm, which it returns after the step), `update()` staying after it; `zero_grad` also clears the "
            "model's gradients; in the asynchronous form the other methods that touch the optimizer wait for the "
            "running step first (`self._model.synchronize()`), and so do the caller's writes of an optimizer it "
            "handed to the wrapper; where the wrapper is built, the model is wrapped and the parameters or "
            "optimizer it gets are built on `model.optim_parameters()`, and the construction gets `model=model`",
            "一个在所包装的优化器旁持有 `self.scaler = GradScaler(...)` 的类，提供训练循环依次调用的优化器接口"
            "（fairseq 的 AMP 优化器）：`backward(loss)`（`self.scaler.scale(loss).backward(...)`）、处理梯度的方法"
            "（`multiply_grads(c)`、返回范数的 `clip_grad_norm(c)`、以 `self.scaler.update()` 结尾的 `step()`）、"
            "`zero_grad()`、`get_lr`/`set_lr`，以及把缩放器状态存在某个键下的 `state_dict`/`load_state_dict`",
            "该类保持接口不变：`__init__` 以仅限关键字的参数 `model` 接收 RoundPipe 模型，缩放器改为 "
            "`roundpipe.GradScaler`；`backward` 按原样留在调用方线程上（autograd 形式）；每个处理梯度的方法（包括把优化器的"
            "参数交给辅助函数或对其循环的方法，例如计算梯度范数的方法）的函数体变为 `_step_fn`，交给它自己的 `self._model.step`（使用 `--exact` 时同步等待；方法返回值（如范数）时也"
            "总是等待，并在步骤之后返回该值），`update()` 留在其后；`zero_grad` 同时清除模型的梯度；异步形式下，"
            "其他访问优化器的方法先等待正在运行的步骤（`self._model.synchronize()`），调用方对交给包装类的优化器"
            "的写操作也同样等待；在构造包装类的地方，模型被包装，交给它的参数或优化器改为基于 "
            "`model.optim_parameters()` 构建，构造调用加上 `model=model`",
        ),
        Pattern(
            "an optimizer wrapper with anything else: a base class, a method handing the scaler or (asynchronous "
            "form) the optimizer out, a gradient method that calls another method of the wrapper, is decorated, "
            "returns early or runs `update()` anywhere but at its end, `scaler.step` given more than the "
            "optimizer (a closure), a backward with `create_graph=True` or other arguments than `retain_graph`, "
            "a `zero_grad` that touches `.grad` itself, an instance used other than through its methods "
            "(asynchronous form); a wrapper handed its scaler from outside (`self.scaler = scaler`)",
            "refused (RPM111, naming the method and why; RPM106 for a scaler handed in, which other code may "
            "use too); the files using the class are refused with it",
            "带有其他写法的优化器包装类：有基类、某个方法把缩放器或（异步形式下）优化器交出去、处理梯度的方法调用"
            "包装类的其他方法、带装饰器、提前返回或在末尾以外的地方调用 `update()`、`scaler.step` 除优化器外还有"
            "其他参数（closure）、反向传播带 `create_graph=True` 或除 `retain_graph` 之外的参数、`zero_grad` "
            "自己操作 `.grad`、（异步形式下）不通过方法而直接使用实例的属性；从外部传入缩放器的包装类"
            "（`self.scaler = scaler`）",
            "拒绝迁移（RPM111，指出是哪个方法以及原因；缩放器从外部传入时报告 RPM106，因为其他代码也可能使用它）；"
            "使用该类的文件一并拒绝",
        ),
    ),
    examples=(
        Example(
            _WRAPPER,
            expect=(
                "    def __init__(self, params, lr, *, model):\n        self._model = model\n",
                "        self.scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())\n",
                "    def backward(self, loss):\n        self.scaler.scale(loss).backward()\n",
                "    def clip_grad_norm(self, max_norm):\n        result = None\n\n        def _step_fn():\n"
                "            nonlocal result\n            self.scaler.unscale_(self.optimizer)\n"
                "            result = torch.nn.utils.clip_grad_norm_(self.params, max_norm)\n\n"
                "        self._model.step(_step_fn, is_async=False)\n        return result\n",
                "    def step(self):\n        def _step_fn_2():\n            self.scaler.step(self.optimizer)\n\n"
                "        self._model.step(_step_fn_2)\n        self.scaler.update()\n",
                "    def zero_grad(self):\n        self._model.synchronize()\n        self._model.zero_grad()\n",
                "    def set_lr(self, lr):\n        self._model.synchronize()\n",
                "    optimizer = AmpOptimizer(model.optim_parameters(), lr=1e-3, model=model)\n",
                "        norm = optimizer.clip_grad_norm(1.0)  # logged below\n",
            ),
        ),
        Example(
            _HANDED_OPTIMIZER,
            expect=(
                "    base = torch.optim.SGD(model.optim_parameters(), lr=0.1)\n"
                "    optimizer = AmpOptimizer(base, model=model)\n",
                "        optimizer.step(max_norm=1.0)\n        model.synchronize()\n        scheduler.step()\n",
                "        def _step_fn():\n            if max_norm is not None:\n",
            ),
        ),
        Example(_WRAPPER.replace("class AmpOptimizer:", "class AmpOptimizer(BaseOptimizer):"), codes=("RPM111",)),
        Example(
            _WRAPPER.replace(
                "    def zero_grad(self):\n",
                "    @property\n    def loss_scaler(self):\n        return self.scaler\n\n    def zero_grad(self):\n",
            ),
            codes=("RPM111",),
        ),
        Example(
            _WRAPPER.replace("self.scaler.step(self.optimizer)", "self.scaler.step(self.optimizer, closure)"),
            codes=("RPM111",),
        ),
        Example(
            _WRAPPER.replace("    def __init__(self, params, lr):", "    def __init__(self, params, lr, scaler):")
            .replace('        self.scaler = torch.amp.GradScaler("cuda")\n', "        self.scaler = scaler\n")
            .replace(
                "    optimizer = AmpOptimizer(model.parameters(), lr=1e-3)\n",
                '    scaler = torch.amp.GradScaler("cuda")\n    optimizer = AmpOptimizer(model.parameters(), 1e-3, scaler)\n',
            ),
            codes=("RPM106",),
        ),
        Example(  # near-miss: an fp32 optimizer wrapper, no scaler
            _WRAPPER.replace('        self.scaler = torch.amp.GradScaler("cuda")\n', "        # no GradScaler here\n")
            .replace("        self.scaler.scale(loss).backward()\n", "        loss.backward()\n")
            .replace("        self.scaler.unscale_(self.optimizer)\n", "")
            .replace(
                "        self.scaler.step(self.optimizer)\n        self.scaler.update()\n",
                "        self.optimizer.step()\n",
            )
            .replace('        state["loss_scaler"] = self.scaler.state_dict()\n', ""),
        ),
    ),
)
