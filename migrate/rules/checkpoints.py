"""Rule checkpoints: evaluation and checkpoints go through the wrapped module after a synchronize; aliases follow."""

from . import Example, Pattern, Rule

RULE = Rule(
    name="checkpoints",
    order=70,
    description="evaluation and checkpoints go through the wrapped module after a synchronize; aliases follow",
    codes=("RPM114", "RPM115", "RPM139", "RPM141"),
    implemented_in=("model_uses.py", "parallel.py", "shared_parameters.py", "weight_writes.py"),
    patterns=(
        Pattern(
            "`model.eval()`, `model.state_dict()`, `torch.save(model, f)` (evaluation, checkpoints)",
            "`model.synchronize()` inserted before; `model.state_dict()`/`load_state_dict()` go to the wrapped module (`model.model...`) so checkpoints keep their keys, and `torch.save(model, f)` saves `model.model`; scaler state dicts are compatible as they are",
            "`model.eval()`、`model.state_dict()`、`torch.save(model, f)`（评估、检查点）",
            "在其前面插入 `model.synchronize()`；`model.state_dict()`/`load_state_dict()` 改为作用于被包装的模块（`model.model...`），使检查点的键保持不变，`torch.save(model, f)` 保存 `model.model`；缩放器的状态字典本身即兼容",
        ),
        Pattern(
            "an alias bound after the wrap (`raw_model = model`)",
            "rewritten like the model: `raw_model.model.state_dict()`, synchronized before; an alias bound before the wrap and used after it, `model.module`, `torch.compile(model)`, an averaged copy the tool does not know (known ones follow `model.model`, rule model_averages) refuse the file (RPM114); a second, plain `loss.backward()` loop refuses it too (RPM115); a function or a `self.method(...)` the model is handed to is followed into; one changed for it and also called with another object (`evaluate(model)`, `evaluate(restored)`) refuses the file (RPM139), unless its only change is a `synchronize()` and it does not train: that line then goes before each call handing it the model; weights written in place after the optimizer is built (`nn.init.zeros_(model.head.bias)`, `for p in model.parameters(): p.mul_(s)`, `model.apply(init)`), also through a call, a builtin, a name or a comprehension (`model.get_submodule('fc').weight.zero_()`, `next(model.parameters()).data.mul_(s)`, `w = model.fc.weight; w.data.clamp_(-c, c)`, `vector_to_parameters(v, model.parameters())`), refuse it (RPM141), also through an index of it (`model[2].bias.zero_()`; indexing alone goes to the wrapped module, rule wrapped_containers)",
            "包装之后绑定的别名（`raw_model = model`）",
            "与模型一样改写：`raw_model.model.state_dict()`，并在其前同步；包装之前绑定、之后使用的别名、`model.module`、`torch.compile(model)`、工具不认识的平均副本（已知的改为跟随 `model.model`，见规则 model_averages）会使文件被拒绝（RPM114）；另一个普通的 `loss.backward()` 循环也会（RPM115）；模型被传入的函数或 `self.method(...)` 会被跟进；为该模型而改写、又以别的对象调用的函数（`evaluate(model)`、`evaluate(restored)`）也会使文件被拒绝（RPM139），除非它唯一的改动是 `synchronize()` 且它不训练模型：这一行随后放到每个把模型交给它的调用之前；在构建优化器之后原地写入权重（`nn.init.zeros_(model.head.bias)`、`for p in model.parameters(): p.mul_(s)`、`model.apply(init)`），包括经由调用、内置函数、变量名或推导式写入（`model.get_submodule('fc').weight.zero_()`、`next(model.parameters()).data.mul_(s)`、`w = model.fc.weight; w.data.clamp_(-c, c)`、`vector_to_parameters(v, model.parameters())`），也会（RPM141），经由下标写入也一样（`model[2].bias.zero_()`；单纯取下标改为作用于被包装的模块，见规则 wrapped_containers）",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n    raw_model = model\n    torch.save(raw_model.state_dict(), "last.pt")\n',
            expect=('    raw_model.synchronize()\n    torch.save(raw_model.model.state_dict(), "last.pt")',),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n    model = torch.compile(model)\n',
            codes=("RPM114",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n    for x, y in batches:\n        torch.nn.functional.mse_loss(model(x), y).backward()\n',
            codes=("RPM115",),
        ),
        Example(
            'import torch\n\n\n@torch.no_grad()\ndef evaluate(model, x):\n    model.eval()\n    return model(x)\n\n\ndef main(batches, x):\n    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for inputs, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(inputs), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        evaluate(model, x)\n',
            expect=("    model.synchronize()\n    model.eval()",),
        ),
        Example(
            'import torch\n\n\n@torch.no_grad()\ndef evaluate(model, x):\n    model.eval()\n    return model(x)\n\n\ndef main(batches, x):\n    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for inputs, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(inputs), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        evaluate(model, x)\n    evaluate(torch.nn.Linear(4, 1), x)\n',
            expect=("        model.synchronize()\n        evaluate(model, x)\n    evaluate(torch.nn.Linear(4, 1), x)",),
        ),
        Example(
            'import torch\n\n\n@torch.no_grad()\ndef evaluate(model, x):\n    model.eval()\n    return model(x)\n\n\ndef main(batches, x):\n    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for inputs, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(inputs), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        evaluate(model, x)\n'.replace(
                "@torch.no_grad()", "class Shadow(torch.optim.swa_utils.AveragedModel):\n    pass\n\n\n@torch.no_grad()"
            )
            + "    shadow = Shadow(model)\n",
            expect=("    model.synchronize()\n    shadow = Shadow(model.model)\n",),
        ),
        Example(
            'import torch\n\n\nclass Trainer:\n    def __init__(self):\n        self.model = torch.nn.Linear(4, 1)\n        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        self.scaler = torch.amp.GradScaler("cuda")\n\n    def train_step(self, x, y):\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(self.model(x), y)\n        self.scaler.scale(loss).backward()\n        self.scaler.step(self.optimizer)\n        self.scaler.update()\n        self.optimizer.zero_grad()\n\n    def weights_of(self, model):\n        return model.state_dict()\n\n    def checkpoint(self):\n        return {"model": self.weights_of(self.model)}\n',
            expect=("        return model.model.state_dict()",),
        ),
        Example(
            'import torch\n\n\nclass Trainer:\n    def __init__(self):\n        self.model = torch.nn.Linear(4, 1)\n        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        self.scaler = torch.amp.GradScaler("cuda")\n\n    def train_step(self, x, y):\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(self.model(x), y)\n        self.scaler.scale(loss).backward()\n        self.scaler.step(self.optimizer)\n        self.scaler.update()\n        self.optimizer.zero_grad()\n\n    def weights_of(self, model):\n        return model.state_dict()\n\n    def checkpoint(self):\n        return {"model": self.weights_of(self.model), "fresh": self.weights_of(torch.nn.Linear(4, 1))}\n',
            codes=("RPM139",),
        ),
        Example(
            'import torch\n\n\ndef main(batches):\n    model = torch.nn.Linear(4, 1)\n    torch.nn.init.zeros_(model.bias)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=("    torch.nn.init.zeros_(model.bias)\n    model = roundpipe.RoundPipe(",),
        ),
        Example(
            'import torch\n\n\ndef main(batches):\n    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    torch.nn.init.zeros_(model.bias)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            codes=("RPM141",),
        ),
        Example(
            'import torch\n\n\ndef main(batches):\n    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        WRITE\n'.replace(
                "WRITE", 'model.get_parameter("bias").data.zero_()'
            ),
            codes=("RPM141",),
        ),
        Example(
            'import torch\n\n\ndef main(batches):\n    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        WRITE\n'.replace(
                "WRITE",
                "for p in filter(lambda q: q.dim() > 1, model.parameters()):\n            p.data.clamp_(-0.01, 0.01)",
            ),
            codes=("RPM141",),
        ),
        Example(
            'import torch\n\n\ndef main(batches):\n    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        WRITE\n'.replace(
                "WRITE", "n = sum(p.numel() for p in model.parameters())"
            ),
            expect=("        n = sum(p.numel() for p in model.parameters())",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n    torch.save(model, "whole.pt")\n',
            expect=('    model.synchronize()\n    torch.save(model.model, "whole.pt")',),
        ),
        Example(
            'import torch\n\n\ndef save(model, scaler: "torch.amp.GradScaler"):\n    torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, "c.pt")\n',
        ),
    ),
)
