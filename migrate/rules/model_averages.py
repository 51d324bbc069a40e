"""Rule model_averages: an EMA or averaged copy of the model follows the wrapped module (``model.model``)."""

import functools

from . import Example, Pattern, Rule

_TRAIN = (
    "import copy\n\nimport torch\n{imports}\n\n{classes}"
    "def train(model, batches):\n"
    "{before}"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    '    scaler = torch.amp.GradScaler("cuda")\n'
    "{after}"
    "    for i, (x, y) in enumerate(batches):\n"
    '        with torch.autocast("cuda"):\n'
    "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "        scaler.scale(loss).backward()\n"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
    "        optimizer.zero_grad()\n"
    "{update}"
    "{end}"
)


#: the training function with the parts an example fills in (the others left out)
_train = functools.partial(
    _TRAIN.format, imports="", classes="", before="", after="", update="", end="    return ema\n"
)


_SWA = "from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn"
_BUILD_SWA = "    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999), use_buffers=True)\n"
_UPDATE_SWA = "        ema.update_parameters(model)\n"
_SUBCLASS = (
    "class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):\n"
    "    def __init__(self, model, decay, device):\n"
    "        def ema_avg(avg_param, param, num_averaged):\n"
    "            return decay * avg_param + (1 - decay) * param\n\n"
    "        super().__init__(model, device, ema_avg, use_buffers=True)\n\n\n"
)
_HAND_WRITTEN = (
    "class EMA:\n"
    "    def __init__(self, model, decay=0.999):\n"
    "        self.module = copy.deepcopy(model).eval()\n"
    "        self.decay = decay\n\n"
    "    @torch.no_grad()\n"
    "    def update(self, model):\n"
    "        for e, p in zip(self.module.state_dict().values(), model.state_dict().values()):\n"
    "            if e.dtype.is_floating_point:\n"
    "                e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)\n"
    "{extra}\n\n"
)
_RESTORE = (
    "\n    @torch.no_grad()\n"
    "    def restore(self, model):  # writes the average into the model\n"
    "        for e, p in zip(self.module.parameters(), model.parameters()):\n"
    "            p.copy_(e)\n"
)
_KEPT = (
    "class EMA:\n"
    "    def __init__(self, model, beta=0.99):\n"
    "        self.online = model\n"
    "        self.ema_model = copy.deepcopy(model)\n"
    "        self.beta = beta\n\n"
    "    @torch.no_grad()\n"
    "    def update(self):\n"
    "        for e, p in zip(self.ema_model.parameters(), self.online.parameters()):\n"
    "            {write}\n\n\n"
)

RULE = Rule(
    name="model_averages",
    order=66,
    description="an EMA or averaged copy of the model follows the wrapped module (`model.model`)",
    codes=("RPM114", "RPM141"),
    implemented_in=("model_averages.py", "deferred_syncs.py"),
    patterns=(
        Pattern(
            "an EMA built from the model, before or after the wrap: `torch.optim.swa_utils.AveragedModel` (with "
            "`get_ema_multi_avg_fn`, `use_buffers=True`) or a subclass of it (torchvision's "
            "`ExponentialMovingAverage`), timm's `ModelEma`/`ModelEmaV2`/`ModelEmaV3`, ultralytics' `ModelEMA`, "
            "or an EMA class of the file (`class EMA:` deep-copying the model, updating from its `state_dict()` "
            "or `parameters()`), updated with the model (`update_parameters(model)`, `update(model, step=)`, "
            "`update_attr(model)`, every k steps or after a warm-up)",
            "the EMA gets the wrapped module (`AveragedModel(model.model, ...)`, `ema.update(model.model)`); "
            "under `--exact` it averages the original's weights; in the asynchronous form an update inside the "
            "training loop reads the weights one step old (never torn: only the main thread writes them), one "
            "after the loop gets `model.synchronize()` first; a function evaluating both the model and the EMA "
            "(`evaluate(model_ema)`) gets its `synchronize()` before the calls that hand it the model",
            "由模型构建的 EMA（包装之前或之后）：`torch.optim.swa_utils.AveragedModel`（配合 "
            "`get_ema_multi_avg_fn`、`use_buffers=True`）或其子类（torchvision 的 `ExponentialMovingAverage`）、"
            "timm 的 `ModelEma`/`ModelEmaV2`/`ModelEmaV3`、ultralytics 的 `ModelEMA`，或本文件中的 EMA 类"
            "（`class EMA:` 深拷贝模型，从其 `state_dict()` 或 `parameters()` 更新），用模型更新"
            "（`update_parameters(model)`、`update(model, step=)`、`update_attr(model)`，每 k 步或预热之后）",
            "EMA 改为接收被包装的模块（`AveragedModel(model.model, ...)`、`ema.update(model.model)`）；"
            "在 `--exact` 下它平均的是与原程序相同的权重；在异步形式中，训练循环内的更新读取旧一步的权重"
            "（不会读到一半：只有主线程写入权重），循环之后的更新先调用 `model.synchronize()`；同时评估模型与 "
            "EMA 的函数（`evaluate(model_ema)`）的 `synchronize()` 放在把模型交给它的调用之前",
        ),
        Pattern(
            "the EMA written back into the model after the optimizer is built (`ema.copy_to(model)`, "
            "`ema.restore(model)`, `apply_shadow`), an EMA class of the file whose methods write the model they "
            "get or keep (`p.copy_(e)`), a method of an EMA object the tool does not know to only read the model, "
            "or an average kept on the parameters themselves (torch_ema's `ExponentialMovingAverage(model.parameters())`)",
            "refused (RPM141 for the writes: the next step would write the optimizer's copies back over them; "
            "RPM114 for the unknown method and the parameters' average); evaluate the EMA module itself instead",
            "在构建优化器之后把 EMA 写回模型（`ema.copy_to(model)`、`ema.restore(model)`、`apply_shadow`）、"
            "本文件中其方法会写入所得或所保存模型的 EMA 类（`p.copy_(e)`），工具不知道是否只读取模型的 EMA 对象方法，或保存在参数本身上的平均（torch_ema 的 `ExponentialMovingAverage(model.parameters())`）",
            "拒绝（写入为 RPM141：下一步会用优化器副本覆盖它们；未知方法与参数上的平均为 RPM114）；请直接评估 EMA 模块本身",
        ),
    ),
    examples=(
        Example(
            _train(imports=_SWA, after=_BUILD_SWA, update="        if i % 2 == 0:\n    " + _UPDATE_SWA),
            expect=(
                "ema = AveragedModel(model.model, multi_avg_fn=get_ema_multi_avg_fn(0.999), use_buffers=True)",
                "            ema.update_parameters(model.model)\n",
            ),
        ),
        Example(
            _train(
                classes=_SUBCLASS, after="    ema = ExponentialMovingAverage(model, 0.99, 'cpu')\n", update=_UPDATE_SWA
            ),
            expect=("ExponentialMovingAverage(model.model, 0.99, 'cpu')", "ema.update_parameters(model.model)"),
        ),
        Example(
            _train(
                before="    ema = EMA(model)  # built before the wrap: a copy of the plain module\n",
                classes=_HAND_WRITTEN.format(extra=""),
                update="        ema.update(model)\n",
            ),
            expect=("    ema = EMA(model)  # built before the wrap", "        ema.update(model.model)\n"),
        ),
        Example(
            _train(
                imports="from timm.utils import ModelEmaV3",
                after="    ema = ModelEmaV3(model, decay=0.9998)\n",
                update="        ema.update(model, step=i)\n",
                end="    ema.update(model)\n",
            ),
            expect=(
                "ModelEmaV3(model.model, decay=0.9998)",
                "ema.update(model.model, step=i)",
                "    model.synchronize()\n    ema.update(model.model)\n",
            ),
        ),
        Example(
            _train(
                classes=_KEPT.format(write="e.lerp_(p, 1 - self.beta)"),
                after="    ema = EMA(model)\n",
                update="        ema.update()\n",
                end="    ema.update()  # after the loop: reads the last step's weights\n",
            ),
            expect=("    ema = EMA(model.model)\n", "    model.synchronize()\n    ema.update()  # after the loop"),
        ),
        Example(
            _train(
                classes=_KEPT.format(write="e.lerp_(p, 1 - self.beta)"),
                after="    ema = EMA(model)\n",
                update="        ema.update()\n",
            ),
            codes=("RPM114",),
        ),
        Example(
            _train(
                classes=_HAND_WRITTEN.format(extra=_RESTORE),
                after="    ema = EMA(model)\n",
                update="        ema.update(model)\n",
                end="    ema.restore(model)\n",
            ),
            codes=("RPM141",),
        ),
        Example(
            _train(
                classes=_KEPT.format(write="p.copy_(e)"),
                after="    ema = EMA(model)\n",
                update="        ema.update()\n",
            ),
            codes=("RPM141",),
        ),
        Example(
            _train(
                imports="from timm.utils import ModelEmaV2",
                after="    ema = ModelEmaV2(model)\n",
                update="        ema.update(model)\n",
                end="    ema.copy_to(model)\n",
            ),
            codes=("RPM141",),
        ),
        Example(
            _train(
                imports="from timm.utils import ModelEmaV2",
                after="    ema = ModelEmaV2(model)\n",
                update="        ema.update(model)\n        ema.blend_into(model)\n",
            ),
            codes=("RPM114",),
        ),
        Example(
            _train(
                imports="from torch_ema import ExponentialMovingAverage",
                after="    ema = ExponentialMovingAverage(model.parameters(), decay=0.995)\n",
                update="        ema.update()\n",
            ),
            codes=("RPM114",),
        ),
        Example(
            'import torch\n\n\ndef train(model, ema, batches):  # the EMA is built in a file not given\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        ema.update(model)\n',
            codes=("RPM114",),
        ),
        Example(
            "import copy\n\nimport torch\n\n\n"
            "def average(model, decay):  # an EMA without a GradScaler: not a training step to migrate\n"
            "    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(decay))\n"
            "    ema.update_parameters(model)\n"
            "    return ema\n"
        ),
    ),
)
