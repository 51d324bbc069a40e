"""Rule scaler_constructor: GradScaler constructions become roundpipe.GradScaler, positional arguments kept by meaning."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="scaler_constructor",
    order=10,
    description="GradScaler constructions become roundpipe.GradScaler, positional arguments kept by meaning",
    codes=("RPM104", "RPM105"),
    implemented_in=("torch_amp.py", "names.py"),
    patterns=(
        Pattern(
            "`torch.amp.GradScaler(dev, ...)`, `torch.GradScaler(...)`, from-imports, aliases, imports inside functions, try/except fallbacks",
            "`roundpipe.GradScaler(dev, ...)`, arguments unchanged",
            "`torch.amp.GradScaler(dev, ...)`、`torch.GradScaler(...)`、from 导入、别名、函数内的导入、try/except 回退",
            "`roundpipe.GradScaler(dev, ...)`，参数不变",
        ),
        Pattern(
            "`torch.cuda.amp.GradScaler(2.**10, ...)` (init_scale first)",
            '`roundpipe.GradScaler("cuda", 2.**10, ...)`: the legacy wrapper\'s implied device is made explicit, so the positional init_scale keeps its meaning (and, as with torch, the scaler disables itself where CUDA is missing)',
            "`torch.cuda.amp.GradScaler(2.**10, ...)`（第一个参数为 init_scale）",
            '`roundpipe.GradScaler("cuda", 2.**10, ...)`：旧式包装器隐含的设备被显式写出，使位置参数 init_scale 保持原意（并且与 torch 一样，在没有 CUDA 的地方缩放器会自行禁用）',
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.cuda.amp.GradScaler(2.0 ** 10)\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=('roundpipe.GradScaler("cuda", 2.0 ** 10)',),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=('roundpipe.GradScaler("cuda", init_scale=1024.0)',),
        ),
        Example(
            'import torch\n\nSCALERS = {"main": torch.amp.GradScaler("cuda")}\n',
            codes=("RPM105",),
        ),
        Example(
            'import roundpipe\n\nscaler = roundpipe.GradScaler("cuda")  # already RoundPipe\'s GradScaler\n',
        ),
    ),
)
