"""Rule kept_statements: statements between forward and backward that the loss does not need stay on the main thread, in order."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="kept_statements",
    order=40,
    description="statements between forward and backward that the loss does not need stay on the main thread, in order",
    codes=("RPM113",),
    implemented_in=("rules/loss_function.py", "syntax.py"),
    patterns=(
        Pattern(
            "other statements between the forward and the backward (a next-batch fetch, sample counting, logging)",
            "stay on the main thread, after `forward_backward`, in their order; one that reads a value computed for the loss (other than the loss and the outputs), or that the loss reads later, keeps the step out of the fused form (it takes the autograd form; apex steps are refused, RPM113), as does a forward value read anywhere outside the loss computation (also in the next iteration)",
            "前向与反向之间的其他语句（取下一批数据、统计样本数、日志）",
            "留在主线程上，位于 `forward_backward` 之后，保持原有顺序；若这样的语句读取了为损失计算的值（损失和输出除外），或损失随后会读取它所改动的值，则该步骤不采用融合形式（改用 autograd 形式；apex 的步骤则拒绝迁移，RPM113）；前向中计算的值若在损失计算之外的任何地方被读取（包括下一次迭代），同样如此",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        seen = x.shape[0]  # bookkeeping\n        x, y = next(iter(batches))  # the next batch\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                "model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)\n        seen = x.shape[0]  # bookkeeping\n        x, y = next(iter(batches))  # the next batch\n",
            ),
        ),
        Example(
            'import torch\n\n\ndef log(scaler: "torch.amp.GradScaler", loss):\n    print(loss.item(), scaler.get_scale())  # logging only, no step\n',
        ),
    ),
)
