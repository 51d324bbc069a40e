"""Rule gradient_helpers: project functions working on gradients between the backward and the step."""

from . import Example, Pattern, Rule

_DINO = """import torch


def clip_gradients(model, clip):
    norms = []
    for p in model.parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for name, p in model.named_parameters():
        if "last_layer" in name:
            p.grad = None


def train_one_epoch(student, loader, optimizer, fp16_scaler, epoch, clip):
    for images in loader:
        with torch.autocast("cuda"):
            loss = student(images).mean()
        optimizer.zero_grad()
        fp16_scaler.scale(loss).backward()
        fp16_scaler.unscale_(optimizer)
        param_norms = clip_gradients(student, clip)
        cancel_gradients_last_layer(epoch, student, 1)
        fp16_scaler.step(optimizer)
        fp16_scaler.update()
        print(loss.item(), max(param_norms))


def main(loader):
    student = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    fp16_scaler = torch.amp.GradScaler("cuda")
    for epoch in range(2):
        train_one_epoch(student, loader, optimizer, fp16_scaler, epoch, 3.0)
"""

_DISPATCH = """import torch


def dispatch_clip_grad(parameters, value, mode="norm"):
    if mode == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, value)
    elif mode == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        raise ValueError(f"unknown clip mode {mode}")


def train(model, batches, mode):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        dispatch_clip_grad(model.parameters(), 1.0, mode=mode)  # timm's clip_mode
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""

_TIMM = (
    "from timm.utils import dispatch_clip_grad\n"
    + _DISPATCH.split("def train")[0].split("\n\n\n")[0]
    + "\n\n\ndef train"
    + _DISPATCH.split("def train")[1].replace("mode=mode)  # timm's clip_mode", "mode=MODE)")
)

RULE = Rule(
    name="gradient_helpers",
    order=54,
    description="project functions working on gradients between the backward and the step",
    codes=("RPM158",),
    implemented_in=("gradient_helpers.py", "rules/step_function.py", "multi_step.py"),
    patterns=(
        Pattern(
            "a function of the file, or a top-level function of another given file it imports (`import utils`, "
            "`from utils import f as g`, `from . import utils`), called between the backward and the step that "
            "walks the parameters of the model it is handed and only works on their gradients (`norms = clip_gradients(model, clip)`, "
            "`cancel_gradients_last_layer(epoch, model, n)` setting `p.grad = None`, "
            "`dispatch_clip_grad(model.parameters(), value, mode)`); timm's own `timm.utils.dispatch_clip_grad` in the "
            "mode `'norm'` or `'value'`",
            "moved into `_step_fn` in its order, as `clip_grad_norm_` is: a helper handed the model runs under "
            "`with roundpipe.OptimizerCtx():` (its `model.parameters()`/`named_parameters()` are the optimizer "
            "copies there), `model.parameters()` handed in becomes `model.optim_parameters()`; a returned value "
            "read later is a measured norm (rule grad_norms). A helper that also reads or writes the weights, "
            'other model attributes, tests the names otherwise than `"text" in name`/`name.endswith(...)`, '
            "reads a module-level variable (other than one constant), prints or writes other state refuses the "
            "step (RPM158); the helper's own file is not rewritten",
            "在反向与步骤之间调用、遍历传入模型的参数且只处理其梯度的本文件函数或其导入的其他给定文件的顶层函数"
            "（`import utils`、`from utils import f as g`、`from . import utils`）（"
            "`norms = clip_gradients(model, clip)`、把 `p.grad = None` 的 `cancel_gradients_last_layer(epoch, model, n)`、"
            "`dispatch_clip_grad(model.parameters(), value, mode)`）；以及模式为 `'norm'` 或 `'value'` 的 timm "
            "`timm.utils.dispatch_clip_grad`",
            "与 `clip_grad_norm_` 一样按原顺序移入 `_step_fn`：传入模型的函数在 `with roundpipe.OptimizerCtx():` 中运行"
            "（那里它的 `model.parameters()`/`named_parameters()` 是优化器副本），传入的 `model.parameters()` 改为 "
            "`model.optim_parameters()`；之后读取的返回值按测得的范数处理（规则 grad_norms）。若函数还读写权重、读取模型的"
            '其他属性、以 `"text" in name`/`name.endswith(...)` 以外的方式检查参数名、读取模块级变量（单个常量除外）、'
            "打印或写入其他状态，则拒绝该步骤（RPM158）；函数所在的文件本身不改写",
        ),
    ),
    examples=(
        Example(
            _DINO,
            expect=(
                "        def _step_fn():\n"
                "            nonlocal param_norms\n"
                "            with roundpipe.OptimizerCtx():\n"
                "                fp16_scaler.unscale_(optimizer)\n"
                "                param_norms = clip_gradients(student, clip)\n"
                "                cancel_gradients_last_layer(epoch, student, 1)\n"
                "                fp16_scaler.step(optimizer)\n"
                "                optimizer.zero_grad()\n"
                "\n"
                "        student.step(_step_fn, is_async=False)\n"
                "        fp16_scaler.update()\n",
            ),
        ),
        Example(
            _DISPATCH,
            expect=(
                "        def _step_fn():\n"
                "            scaler.unscale_(optimizer)\n"
                "            dispatch_clip_grad(model.optim_parameters(), 1.0, mode=mode)  # timm's clip_mode\n"
                "            scaler.step(optimizer)\n",
                "        model.step(_step_fn)\n",
            ),
        ),
        Example(  # timm's own dispatcher in a fixed mode is clip_grad_value_
            _TIMM.replace("MODE", '"value"'),
            expect=('            dispatch_clip_grad(model.optim_parameters(), 1.0, mode="value")\n',),
        ),
        Example(  # timm's dispatcher in a mode chosen at run time may be "agc", which reads the weights
            _TIMM.replace("MODE", "mode"),
            codes=("RPM158",),
        ),
        Example(  # adaptive clipping reads the weights, not only the gradients
            _DINO.replace("param_norm = p.grad.data.norm(2)", "param_norm = p.grad.data.norm(2) / p.data.norm(2)"),
            codes=("RPM158",),
        ),
        Example(  # logging inside the helper would run on the optimizer thread
            _DINO.replace("        return\n", '        print("frozen")\n        return\n', 1),
            codes=("RPM158",),
        ),
        Example(  # a module-level list the asynchronous step function would read late
            _DINO.replace(
                "def clip_gradients(model, clip):\n    norms = []\n",
                "SEEN = []\n\n\ndef clip_gradients(model, clip):\n    norms = SEEN\n",
            ),
            codes=("RPM158",),
        ),
        Example(  # a name test the copies' `model.` prefix changes
            _DINO.replace('if "last_layer" in name:', 'if name.startswith("last_layer"):'),
            codes=("RPM158",),
        ),
        Example(  # the helper is handed another module than the trained one
            _DINO.replace(
                "cancel_gradients_last_layer(epoch, student, 1)", "cancel_gradients_last_layer(epoch, other, 1)"
            )
            .replace("def train_one_epoch(student,", "def train_one_epoch(other, student,")
            .replace("train_one_epoch(student,", "train_one_epoch(student, student,"),
            codes=("RPM158",),
        ),
        Example(  # a loop variable handed to the asynchronous step function would be read late
            _DISPATCH.replace("for x, y in batches:", "for mode, (x, y) in enumerate(batches):"),
            codes=("RPM158",),
        ),
        Example(  # near-miss: a plain fp32 step through the same helper
            _DISPATCH.split("def train")[0]
            + "# no GradScaler here\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    for x, y in batches:\n        torch.nn.functional.mse_loss(model(x), y).backward()\n"
            "        dispatch_clip_grad(model.parameters(), 1.0)\n        optimizer.step()\n",
        ),
    ),
)
