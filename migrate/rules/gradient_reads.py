"""Rule gradient_reads: gradients read after the optimizer step refuse the file (they move to the optimizer copies)."""

from . import Example, Pattern, Rule

_STEP = (
    "import torch\n\n\n"
    "def train(model, batches):\n"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    '    scaler = torch.amp.GradScaler("cuda")\n'
    "    for x, y in batches:\n"
    "        optimizer.zero_grad()\n"
    '        with torch.autocast("cuda"):\n'
    "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "        scaler.scale(loss).backward()\n"
    "{before}"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
    "{after}"
)
_NORM = "        print(sum(p.grad.norm() for p in model.parameters()))\n"
_HELPER = "\n\ndef grad_norm(model):\n    return sum(p.grad.norm() for p in model.parameters())\n"
_CALL = "        print(grad_norm(model))\n"
# ``autograd.grad`` computes gradients of its own (an input-gradient penalty): no `.grad` read.
_INPUT_GRAD = (
    "\n\ndef input_grad_norm(model, x):\n"
    "    x = x.clone().requires_grad_(True)\n"
    "    (g,) = torch.autograd.grad(model(x).sum(), x)\n"
    "    return g.norm()\n"
)
_INPUT_CALL = "        print(input_grad_norm(model, x))\n"

RULE = Rule(
    name="gradient_reads",
    order=75,
    description="gradients read after the optimizer step refuse the file (they move to the optimizer copies)",
    codes=("RPM140",),
    implemented_in=("gradient_reads.py", "helper_reads.py"),
    patterns=(
        Pattern(
            "`p.grad` read in the training function after `optimizer.step()` (a norm logged after the step)",
            "refused (RPM140): `model.step` hands the gradients to the optimizer copies; reads between the backward and the step stay where they are and keep working",
            "在训练函数中、`optimizer.step()` 之后读取 `p.grad`（在步骤之后记录的范数）",
            "拒绝（RPM140）：`model.step` 把梯度交给优化器副本；反向与步骤之间的读取保留原位，照常工作",
        ),
        Pattern(
            "a helper of the file reading `p.grad` inside itself (`log_grads(model)`, `self.grad_stats()`, followed three calls deep) called after the step",
            "refused (RPM140) at the call, naming the read; called between the backward and the step, it stays there and keeps working",
            "在步骤之后调用、在自身内部读取 `p.grad` 的本文件辅助函数（`log_grads(model)`、`self.grad_stats()`，最多跟进三层调用）",
            "在调用处拒绝（RPM140），并指出读取的位置；在反向与步骤之间调用时保留原位，照常工作",
        ),
    ),
    examples=(
        Example(_STEP.format(before=_NORM, after=""), expect=(_NORM + "\n        def _step_fn():",)),
        Example(_STEP.format(before="", after=_NORM), codes=("RPM140",)),
        Example(_STEP.format(before="", after=_CALL) + _HELPER, codes=("RPM140",)),
        Example(_STEP.format(before=_CALL, after="") + _HELPER, expect=(_CALL + "\n        def _step_fn():",)),
        Example(_STEP.format(before="", after=_INPUT_CALL) + _INPUT_GRAD, expect=("def _step_fn():",)),
        Example(
            'import torch\n\n\ndef log_gradients(model, scaler: "torch.amp.GradScaler"):  # no step here\n'
            "    print(scaler.get_scale(), sum(p.grad.norm() for p in model.parameters()))\n"
        ),
    ),
)
