"""Rule setup_and_checkpoint_helpers: objects returned by a setup function are followed to the
names its callers unpack; checkpoint helpers that only save or load state keep their keys."""

from . import Example, Pattern, Rule

_SETUP = """import torch


def build():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    return model, optimizer, scaler


def save(path, model, scaler):
    torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, path)


def train(model, optimizer, scaler, batches):
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def main(batches):
    model, optimizer, scaler = build()
    train(model, optimizer, scaler, batches)
    save("last.pt", model, scaler)
    model, optimizer, scaler = build()
    train(model, optimizer, scaler, batches)
"""

RULE = Rule(
    name="setup_and_checkpoint_helpers",
    order=65,
    description=(
        "objects returned by a setup function are followed to the names its callers unpack; "
        "checkpoint helpers that only save or load state keep their keys"
    ),
    codes=("RPM104", "RPM105"),
    implemented_in=("returned.py", "state_helpers.py", "project.py"),
    patterns=(
        Pattern(
            "`return model, optimizer, scaler` of a setup function, unpacked by its callers "
            "(`model, optimizer, scaler = build()`, possibly several times)",
            "followed through the return: the wrap and `model.optim_parameters()` go into the "
            "setup function, the callers' names are the RoundPipe model and scaler; a call site "
            "that does not unpack the object into a plain name refuses the file (RPM105)",
            "设置函数中的 `return model, optimizer, scaler`，由调用方解包"
            "（`model, optimizer, scaler = build()`，可以多次）",
            "穿过 return 跟踪：包装和 `model.optim_parameters()` 放进设置函数，调用方的名字即 "
            "RoundPipe 模型和缩放器；若某个调用处没有把对象解包到普通名字，文件被拒绝（RPM105）",
        ),
        Pattern(
            "a checkpoint helper of another given file whose model, optimizer or scaler parameter "
            "is only used by `state_dict()`, `load_state_dict()` and `is None` tests",
            "the scaler and optimizer are passed as they are (their state dicts are compatible); "
            "the model becomes `model.model` after a `model.synchronize()`, so keys stay the "
            "module's and a load refreshes the optimizer copies; the helper's file is unchanged",
            "另一个给定文件中的检查点辅助函数，其模型、优化器或缩放器参数只用于 `state_dict()`、"
            "`load_state_dict()` 与 `is None` 判断",
            "缩放器和优化器照原样传入（其状态字典兼容）；模型在 `model.synchronize()` 之后改为 "
            "`model.model`，因此键仍是模块的键，加载时会刷新优化器副本；辅助函数所在文件不变",
        ),
    ),
    examples=(
        Example(
            _SETUP,
            expect=(
                "    model = roundpipe.RoundPipe(model, model_run_config=",
                "    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)\n"
                "    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())\n"
                "    return model, optimizer, scaler\n",
                'torch.save({"model": model.model.state_dict(), "scaler": scaler.state_dict()}, path)',
                "        model.step(_step_fn)\n        scaler.update()\n",
            ),
        ),
        Example(  # the caller keeps the returned tuple whole: the scaler cannot be followed
            _SETUP.replace(
                "    model, optimizer, scaler = build()\n    train(model, optimizer, scaler, batches)\n    save",
                "    parts = build()\n    train(*parts, batches)\n    save",
            ),
            codes=("RPM104", "RPM105"),
        ),
        Example(  # near-miss: a helper returning state and a scaler nobody trains with
            'import torch\n\n\ndef checkpoint_state(model, scaler: "torch.amp.GradScaler"):\n'
            '    state = {"model": model.state_dict(), "scaler": scaler.state_dict()}\n'
            "    return state, scaler\n",
        ),
    ),
)
