"""Rule either_scaler: a GradScaler chosen by a conditional expression whose every branch builds one."""

from . import Example, Pattern, Rule

_TRAIN = (
    "import torch\n\n\n"
    "def train(model, batches, use_cuda):\n"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    scaler = {scaler}\n"
    "    for x, y in batches:\n"
    "        optimizer.zero_grad()\n"
    '        with torch.autocast("cuda"):\n'
    "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "        scaler.scale(loss).backward()\n"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
)

RULE = Rule(
    name="either_scaler",
    order=11,
    description="a GradScaler chosen by a conditional expression whose every branch builds one",
    codes=("RPM104", "RPM120"),
    implemented_in=("either_scaler.py", "scaler_bindings.py", "torch_amp.py"),
    patterns=(
        Pattern(
            '`scaler = GradScaler("cuda") if use_cuda else GradScaler("cpu")` (a local or `self.scaler`, '
            "nested conditionals too)",
            "every branch becomes `roundpipe.GradScaler(...)` and the scaler is followed once; a branch that is "
            "no GradScaler (`GradScaler() if amp else NoScaler()`) refuses the file, naming that branch "
            "(RPM104; RPM120 for an attribute)",
            '`scaler = GradScaler("cuda") if use_cuda else GradScaler("cpu")`（局部变量或 `self.scaler`，'
            "也包括嵌套的条件表达式）",
            "每个分支都改为 `roundpipe.GradScaler(...)`，缩放器只跟踪一次；若某个分支不是 GradScaler"
            "（`GradScaler() if amp else NoScaler()`），文件被拒绝并指出该分支（RPM104；属性为 RPM120）",
        ),
    ),
    examples=(
        Example(
            _TRAIN.format(scaler='torch.amp.GradScaler("cuda") if use_cuda else torch.amp.GradScaler("cpu")'),
            expect=(
                "    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available()) if use_cuda "
                "else roundpipe.GradScaler()\n",
                "        model.step(_step_fn)\n",
            ),
        ),
        Example(
            "class NoScaler:\n    pass\n\n\n"
            + _TRAIN.format(scaler='torch.amp.GradScaler("cuda") if use_cuda else NoScaler()'),
            codes=("RPM104",),
        ),
        Example(  # near-miss: already RoundPipe's scaler in both branches
            "import roundpipe\n\nUSE_CUDA = False\n"
            "scaler = roundpipe.GradScaler() if USE_CUDA else roundpipe.GradScaler(enabled=False)\n"
        ),
    ),
)
