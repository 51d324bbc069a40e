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
            '`roundpipe.GradScaler(...)`, upstream\'s signature: the device folded into `enabled=` (`"cuda"` or none: `enabled=torch.cuda.is_available()`; another literal such as `"cpu"`: dropped; an expression `d`: `enabled=d != "cuda" or torch.cuda.is_available()`; each and\'ed with the original `enabled=`), so it disables itself exactly where torch\'s does; the other arguments unchanged. Kept as written (valid here only) for a positional `enabled`, a comment on the device, or no `import torch`',
            "`torch.amp.GradScaler(dev, ...)`、`torch.GradScaler(...)`、from 导入、别名、函数内的导入、try/except 回退",
            '`roundpipe.GradScaler(...)`，采用上游的签名：设备并入 `enabled=`（`"cuda"` 或未给出：`enabled=torch.cuda.is_available()`；`"cpu"` 等其他字面量：去掉；表达式 `d`：`enabled=d != "cuda" or torch.cuda.is_available()`；均与原有的 `enabled=` 取与），因此恰好在 torch 的缩放器会自行禁用的地方它同样禁用；其他参数不变。位置参数形式的 `enabled`、设备参数上带注释或没有 `import torch` 时保持原样（仅在本发行版中有效）',
        ),
        Pattern(
            "`torch.cuda.amp.GradScaler(2.**10, ...)` (init_scale first)",
            "`roundpipe.GradScaler(2.**10, ..., enabled=torch.cuda.is_available())`: the legacy wrapper's implied device becomes the CUDA check, and the positional init_scale keeps its place (upstream's first parameter)",
            "`torch.cuda.amp.GradScaler(2.**10, ...)`（第一个参数为 init_scale）",
            "`roundpipe.GradScaler(2.**10, ..., enabled=torch.cuda.is_available())`：旧式包装器隐含的设备变为 CUDA 检查，位置参数 init_scale 保持原位（即上游的第一个参数）",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.cuda.amp.GradScaler(2.0 ** 10)\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=("roundpipe.GradScaler(2.0 ** 10, enabled=torch.cuda.is_available())",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=("roundpipe.GradScaler(init_scale=1024.0, enabled=torch.cuda.is_available())",),
        ),
        Example(
            'import torch\n\nSCALERS = [torch.amp.GradScaler("cuda")]\n',
            codes=("RPM105",),
        ),
        Example(
            'import roundpipe\n\nscaler = roundpipe.GradScaler("cuda")  # already RoundPipe\'s GradScaler\n',
        ),
    ),
)
