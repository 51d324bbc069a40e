"""Rule apex_two_path: ``amp.scale_loss`` in one branch of an ``if``, a plain
``loss.backward()`` in the other, and one optimizer step shared after it (NVIDIA's
Tacotron2, WaveGlow, BERT and Megatron-era scripts) migrate in the autograd form.

The step is found after the ``if`` (:mod:`migrate.apex_two_path`): the forward, the loss
code and both branches stay as written, the apex block becoming the RoundPipe model's
``scale_loss`` block; the shared optimizer work (clipping, with an ``if fp16: ... else:
...`` clip per path and ``is_overflow = math.isnan(grad_norm)``, ``optimizer.step()``,
``zero_grad``) moves into one ``_step_fn`` for ``model.step``. apex set up only under the
split's condition gets a disabled set-up for the plain path.
"""

from . import Example, Pattern, Rule

_TACOTRON2 = """import math

import torch


def train(model, criterion, batches, fp16_run, thresh):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if fp16_run:
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    is_overflow = False
    for iteration, (x, y) in enumerate(batches):
        model.zero_grad()
        loss = criterion(model(x), y)
        reduced_loss = loss.item()
        if fp16_run:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        if fp16_run:
            grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), thresh)
            is_overflow = math.isnan(grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), thresh)

        optimizer.step()
        if not is_overflow:
            print(iteration, reduced_loss, grad_norm)
"""

_ONE_CLIP = """import torch
from apex import amp


def train(model, batches, args):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level, enabled=args.fp16)
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
"""

_HANDED_IN = """import torch
from apex import amp


def train(model, optimizer, batches, fp16):
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()


def main(model, batches, fp16):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    train(model, optimizer, batches, fp16)
"""

_MIGRATED = """import roundpipe
import torch


def train(model, batches, args):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level=args.opt_level, enabled=args.fp16)
    amp_scaler = roundpipe.compat.loss_scaler()
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.fp16:
            with model.scale_loss(loss, amp_scaler) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        def _step_fn():
            amp_scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()
"""

RULE = Rule(
    name="apex_two_path",
    order=49,
    description="apex's two-path split (amp.scale_loss or a plain backward in an if, one shared step "
    "after it) migrates in the autograd form: both backwards kept, the shared optimizer work in one "
    "model.step",
    codes=("RPM136",),
    implemented_in=("apex_two_path.py", "apex_amp.py"),
    patterns=(
        Pattern(
            "apex two-path split: `if fp16: with amp.scale_loss(loss, optimizer) as s: s.backward()` / `else: loss.backward()`, then one shared step (`clip_grad_norm_` on `model.parameters()`, or `if fp16: grad_norm = clip_grad_norm_(amp.master_params(optimizer), t); is_overflow = math.isnan(grad_norm) else: grad_norm = clip_grad_norm_(model.parameters(), t)`; `optimizer.step()`); `amp.initialize` unconditional or under the same `if fp16:`",
            "autograd form: the forward, the loss code and both branches stay (the apex block becomes `with model.scale_loss(loss, amp_scaler) as s:`); the shared optimizer work moves into one `_step_fn` for `model.step` (`amp_scaler.unscale_` before the clip, clipping on the optimizer copies, `is_overflow` handed back to the main thread); an `amp.initialize` under `if fp16:` gets `else: model, optimizer = roundpipe.compat.initialize(model, optimizer, enabled=False)`; `amp.initialize` under another condition is refused (RPM136)",
            "apex 双路径拆分：`if fp16: with amp.scale_loss(loss, optimizer) as s: s.backward()` / `else: loss.backward()`，之后是共享的一个步骤（对 `model.parameters()` 的 `clip_grad_norm_`，或 `if fp16: grad_norm = clip_grad_norm_(amp.master_params(optimizer), t); is_overflow = math.isnan(grad_norm) else: grad_norm = clip_grad_norm_(model.parameters(), t)`；`optimizer.step()`）；`amp.initialize` 无条件执行，或位于同一个 `if fp16:` 之下",
            "autograd 形式：前向、损失代码和两个分支保持原样（apex 块变为 `with model.scale_loss(loss, amp_scaler) as s:`）；共享的优化器工作移入交给 `model.step` 的同一个 `_step_fn`（裁剪前执行 `amp_scaler.unscale_`，裁剪作用于优化器副本，`is_overflow` 交回主线程）；位于 `if fp16:` 之下的 `amp.initialize` 会补上 `else: model, optimizer = roundpipe.compat.initialize(model, optimizer, enabled=False)`；位于其他条件之下的 `amp.initialize` 则拒绝迁移（RPM136）",
        ),
    ),
    examples=(
        Example(
            _TACOTRON2,
            expect=(
                '        model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O1")\n'
                "    else:\n        model, optimizer = roundpipe.compat.initialize(model, optimizer, enabled=False)\n",
                "        if fp16_run:\n            with model.scale_loss(loss, amp_scaler) as scaled_loss:\n"
                "                scaled_loss.backward()\n        else:\n            loss.backward()\n",
                "            amp_scaler.unscale_(optimizer)\n            if fp16_run:\n"
                "                grad_norm = torch.nn.utils.clip_grad_norm_(roundpipe.compat.master_params(optimizer), thresh)\n"
                "                is_overflow = math.isnan(grad_norm)\n            else:\n"
                "                grad_norm = torch.nn.utils.clip_grad_norm_(model.optim_parameters(), thresh)\n",
                "            amp_scaler.step(optimizer)\n            optimizer.zero_grad()\n",
            ),
        ),
        Example(
            _ONE_CLIP,
            expect=(
                "        else:\n            loss.backward()\n\n        def _step_fn():\n"
                "            amp_scaler.unscale_(optimizer)\n"
                "            torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)\n"
                "            amp_scaler.step(optimizer)\n            optimizer.zero_grad()\n\n"
                "        model.step(_step_fn)\n        amp_scaler.update()\n",
            ),
        ),
        Example(  # apex set up under another condition: the plain path's model is never wrapped
            _TACOTRON2.replace(
                "    if fp16_run:\n        from apex", "    if torch.cuda.is_available():\n        from apex"
            ),
            codes=("RPM136",),
        ),
        Example(  # apex set up under a condition in the caller, away from the step
            _HANDED_IN,
            codes=("RPM136",),
        ),
        Example(  # the plain branch does more than back-propagate: no split, and no step after the block
            _ONE_CLIP.replace(
                "            loss.backward()\n", "            loss.backward()\n            print(loss.item())\n"
            ),
            codes=("RPM106",),
        ),
        Example(_MIGRATED),  # the split already in RoundPipe form
    ),
)
