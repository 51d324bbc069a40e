"""Rule two_path_amp: optional AMP (a scaler that may be None) and a plain branch beside the AMP one migrate together."""

from . import Example, Pattern, Rule

_OPTIONAL = """import torch


def train(model, batches, amp):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda") if amp else None
    for x, y in batches:
        optimizer.zero_grad()
        with torch.autocast("cuda", enabled=amp):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
"""

_TWO_PATHS = """import torch


def train(model, batches, precision):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    for x, y in batches:
        if precision == "fp16":
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        optimizer.zero_grad()
"""

RULE = Rule(
    name="two_path_amp",
    order=55,
    description="optional AMP (a scaler that may be None) and a plain branch beside the AMP one migrate together",
    codes=("RPM136",),
    implemented_in=("plain_path.py", "two_path.py", "torch_amp.py"),
    patterns=(
        Pattern(
            "`scaler = GradScaler(...) if amp else None`, `if scaler is not None:` / `if scaler:` guards",
            "`roundpipe.GradScaler(...) if amp else None`; the guards are kept",
            "`scaler = GradScaler(...) if amp else None`，以及 `if scaler is not None:` / `if scaler:` 判断",
            "`roundpipe.GradScaler(...) if amp else None`；判断保持不变",
        ),
        Pattern(
            "`if amp: <AMP step> else: loss.backward(); [clip...;] optimizer.step()`",
            "the AMP branch as any step; the plain branch in the autograd form: its backward kept, clipping (on `model.optim_parameters()`), `optimizer.step()`, `zero_grad` and scheduler steps moved into its own `_step_fn` for `model.step`; a `zero_grad()` before or after the `if` stays (after `model.synchronize()` in the asynchronous form); a plain branch that does not step once, unconditionally, refuses the file (RPM136)",
            "`if amp: <AMP 步骤> else: loss.backward(); [裁剪...;] optimizer.step()`",
            "AMP 分支按普通步骤迁移；普通分支采用 autograd 形式：保留其反向，裁剪（改用 `model.optim_parameters()`）、`optimizer.step()`、`zero_grad` 和调度器步骤移入它自己的 `_step_fn`，交给 `model.step`；`if` 之前或之后的 `zero_grad()` 留在原处（异步形式下在其前插入 `model.synchronize()`）；普通分支若不是无条件地恰好执行一次步骤，则拒绝迁移该文件（RPM136）",
        ),
    ),
    examples=(
        Example(
            _OPTIONAL,
            expect=(
                "scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available()) if amp else None",
                "        if scaler is not None:\n            scaler.scale(loss).backward()\n\n"
                "            def _step_fn():\n                scaler.step(optimizer)\n\n"
                "            model.step(_step_fn)\n            scaler.update()\n"
                "        else:\n            loss.backward()\n\n            def _step_fn_2():\n"
                "                optimizer.step()\n\n            model.step(_step_fn_2)\n",
                "        model.synchronize()\n        optimizer.zero_grad()\n",
            ),
        ),
        Example(
            _TWO_PATHS,
            expect=(
                "            loss.backward()\n\n            def _step_fn_2():\n"
                "                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)\n"
                "                optimizer.step()\n\n            model.step(_step_fn_2)\n",
                "        model.synchronize()\n        optimizer.zero_grad()\n",
            ),
        ),
        Example(
            _OPTIONAL.replace(
                "            optimizer.step()\n", "            if loss.item() < 10:\n                optimizer.step()\n"
            ),
            codes=("RPM136",),
        ),
        Example(  # the plain branch back-propagates two losses
            _OPTIONAL.replace(
                "            loss.backward()\n",
                "            loss.backward()\n            loss.backward()\n",
            ),
            codes=("RPM136",),
        ),
        Example(
            'import torch\n\n\ndef log(scaler: "torch.amp.GradScaler | None", loss):\n'
            "    if scaler is not None:  # optional AMP, logging only\n"
            "        print(loss.item(), scaler.get_scale())\n",
        ),
    ),
)
