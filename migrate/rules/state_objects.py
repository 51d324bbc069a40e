"""Rule state_objects: the scaler, model and optimizer held in a state object (a dataclass, NamedTuple, plain class, namespace or string-key dict) are followed through its fields, wherever the state goes in the file."""

from . import Example, Pattern, Rule

_DATACLASS = """import dataclasses

import torch


@dataclasses.dataclass
class TrainState:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    step: int = 0


def create_state():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return TrainState(model, optimizer, torch.amp.GradScaler("cuda"))


def train_step(state, x, y):
    with torch.autocast("cuda"):
        loss = torch.nn.functional.mse_loss(state.model(x), y)
    state.scaler.scale(loss).backward()
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad()
    state.step += 1


def checkpoint(state):
    return {"model": state.model.state_dict(), "scaler": state.scaler.state_dict()}


def main(batches):
    state = create_state()
    for x, y in batches:
        train_step(state, x, y)
    return checkpoint(state)
"""

_DICT = """from types import SimpleNamespace

import torch


def build():
    model = torch.nn.Linear(4, 1)
    return {
        "model": model,
        "optim": torch.optim.SGD(model.parameters(), lr=0.1),
        "scaler": torch.amp.GradScaler("cuda"),
    }


def save(objects):
    return {"model": objects.model.state_dict(), "scaler": objects.scaler.state_dict()}


def main(batches):
    state = build()
    amp_scaler = state["scaler"]
    for x, y in batches:
        loss = state["model"](x).mean()
        if not torch.isfinite(loss):
            raise FloatingPointError(loss.item())
        state["scaler"].scale(loss).backward()
        amp_scaler.step(state["optim"])
        amp_scaler.update()
        state["optim"].zero_grad()
    return save(SimpleNamespace(model=state["model"], scaler=amp_scaler))
"""

_SAVED_WHOLE = _DICT.replace(
    '    return save(SimpleNamespace(model=state["model"], scaler=amp_scaler))\n',
    '    torch.save(state, "last.pt")\n',
)

_KEY_AT_RUN_TIME = _DATACLASS.replace(
    "    for x, y in batches:\n        train_step(state, x, y)\n",
    '    for x, y in batches:\n        train_step(state, x, y)\n        print(getattr(state, "scaler").get_scale())\n',
)

_NEAR_MISS = """import torch


def restore(state, path):
    checkpoint = torch.load(path)
    state["model"].load_state_dict(checkpoint["model"])
    state["scaler"].load_state_dict(checkpoint["scaler"])  # a torch.amp.GradScaler built elsewhere
"""

RULE = Rule(
    name="state_objects",
    order=66,
    description=__doc__.split(": ", 1)[1],
    codes=("RPM125",),
    implemented_in=("state_objects.py", "aliases.py", "torch_amp.py", "rules/model_wrap.py", "model_uses.py"),
    patterns=(
        Pattern(
            "a state object holding the training objects: `TrainState(model, optimizer, scaler)` "
            "(a dataclass, `NamedTuple` or a class whose `__init__` only stores its parameters), "
            '`SimpleNamespace(model=..., scaler=...)`, `{"model": model, "scaler": GradScaler()}`; '
            'the step reads `state.scaler`/`state["scaler"]` (or an alias `amp_scaler = '
            'state["scaler"]`), the state returned by a setup function and passed to step and '
            "checkpoint functions of the file",
            "followed through its fields: the wrap and `model.optim_parameters()` go where the "
            "objects are built, before the state is; the step reads them as written "
            '(`state.model.step(_step_fn)`, `state["scaler"].update()`, either form), checkpoints '
            "become `state.model.model.state_dict()` after `state.model.synchronize()`. Refused "
            "(RPM125): the state handed to a function of another module or library "
            "(`torch.save(state)`, `copy.deepcopy(state)`), read with a key computed at run time, "
            "held by a name bound more than once, a field replaced after the construction, a state "
            "class with methods, or the state built before its optimizer",
            "存放训练对象的状态对象：`TrainState(model, optimizer, scaler)`（dataclass、`NamedTuple` "
            "或 `__init__` 只保存其参数的类）、`SimpleNamespace(model=..., scaler=...)`、"
            '`{"model": model, "scaler": GradScaler()}`；训练步骤读取 `state.scaler`/`state["scaler"]`'
            '（或别名 `amp_scaler = state["scaler"]`），状态由设置函数返回并传给本文件的步骤函数和检查点函数',
            "沿其字段追踪：包装和 `model.optim_parameters()` 放在对象构建处、状态构建之前；步骤按原写法读取它们"
            '（`state.model.step(_step_fn)`、`state["scaler"].update()`，两种形式均可），检查点改为在 '
            "`state.model.synchronize()` 之后使用 `state.model.model.state_dict()`。以下情况被拒绝（RPM125）："
            "状态被交给其他模块或库的函数（`torch.save(state)`、`copy.deepcopy(state)`）、用运行时计算的键读取、"
            "由被绑定多次的名字持有、构建后某个字段被替换、状态类带有方法，或状态在其优化器之前构建",
        ),
    ),
    examples=(
        Example(
            _DATACLASS,
            expect=(
                "    model = roundpipe.RoundPipe(model, model_run_config=",
                "    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)\n"
                "    return TrainState(model, optimizer, roundpipe.GradScaler(enabled=torch.cuda.is_available()))\n",
                "state.model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)",
                "            return state.scaler.scale(loss) / NUM_MICROBATCH\n",
                "    state.model.step(_step_fn)\n    state.scaler.update()\n    state.step += 1\n",
                '    state.model.synchronize()\n    return {"model": state.model.model.state_dict()',
            ),
        ),
        Example(
            _DICT,
            expect=(
                "    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig("
                "num_microbatch=NUM_MICROBATCH))\n    return {\n",
                '"optim": torch.optim.SGD(model.optim_parameters(), lr=0.1),',
                '        state["scaler"].scale(loss).backward()\n\n        def _step_fn():\n'
                '            amp_scaler.step(state["optim"])\n            state["optim"].zero_grad()\n\n'
                '        state["model"].step(_step_fn)\n        amp_scaler.update()\n',
                '    objects.model.synchronize()\n    return {"model": objects.model.model.state_dict()',
            ),
        ),
        Example(_SAVED_WHOLE, codes=("RPM125",)),
        Example(_KEY_AT_RUN_TIME, codes=("RPM125",)),
        Example(_NEAR_MISS),
    ),
)
