"""Rule optimizer_writes: main-thread optimizer-state writes are ordered after the running asynchronous step.

:func:`order_optimizer_writes` finds, for a :class:`~migrate.steps.StepBuilder`
(``step``), every place the step's optimizer may be written on the main thread (the step's
function, the callers that built the optimizer, the callers of the step's function up the
chain the optimizer is handed along, a state object's functions, aliases) and
plans ``model.synchronize()`` before each write there (:mod:`migrate.optimizer_writes`
finds the writes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Scope

from .. import multi_step
from ..aliases import spellings
from ..attributes import InstanceFamily, instance_places
from ..instance_reads import outside_state_uses
from ..optimizer_writes import is_scheduler, may_run_after, optimizer_writes
from ..origins import INLINE
from ..plan import Blocked, WritePlace
from ..step_callers import caller_places
from ..syntax import code
from . import Example, Pattern, Rule

if TYPE_CHECKING:
    from ..recognised import RecognisedStep
    from ..steps import StepBuilder

__all__ = ["RULE", "order_optimizer_writes", "write_places"]

RULE = Rule(
    name="optimizer_writes",
    order=80,
    description="main-thread optimizer-state writes are ordered after the running asynchronous step",
    codes=(),
    implemented_in=("rules/optimizer_writes.py", "optimizer_writes.py"),
    patterns=(
        Pattern(
            "main-thread writes of optimizer state that may run while an asynchronous step is in flight: `for g in optimizer.param_groups: g[\"lr\"] = ...`, a scheduler step outside the step group, `add_param_group`, `optimizer.load_state_dict`, an `optimizer.zero_grad()` left outside the step function (beside a two-path `if`, before a micro-step loop), a helper given the optimizer (`adjust_learning_rate(optimizer, epoch)`); reads of what the step writes in place (`optimizer.state_dict()`, `optimizer.state[p]`, `torch.save(optimizer.state_dict(), path)`) or of any attribute of the scheduler that the step function steps (`scheduler.get_last_lr()`, `scheduler.last_epoch` logged after the step), a method of an object built with the optimizer (`policy = WarmupPolicy(optimizer, lr)`, then `policy.step_update(n)`); any of these in a caller of the step's function after the call, up the chain the optimizer is handed along (`scheduler.step()` in `fit` after `train_step(model, batch, optimizer, scaler)`, or after `run_epoch(...)` calling it; refused with RPM108 when the call hands the model as no name the caller can wait on); in a trainer class's own file, a use of the state its step works on through an instance, outside the class (`trainer.scheduler.get_last_lr()` after `trainer.train_step(x, y)`)",
            "`model.synchronize()` right before them (through the instance for a trainer's state: `trainer.model.synchronize()`), so they run after the running step, as in the original (nothing is added with `--exact`, where the step has finished when `model.step` returns)",
            '异步步骤可能正在运行时、主线程上对优化器状态的写入：`for g in optimizer.param_groups: g["lr"] = ...`、步骤组之外的调度器 step、`add_param_group`、`optimizer.load_state_dict`、留在步骤函数之外的 `optimizer.zero_grad()`（在双路径 `if` 旁、微步循环之前）、接收优化器的辅助函数（`adjust_learning_rate(optimizer, epoch)`）；对步骤原地写入之物的读取（`optimizer.state_dict()`、`optimizer.state[p]`、`torch.save(optimizer.state_dict(), path)`）或对由步骤函数推进的调度器任一属性的读取（在步骤之后记录 `scheduler.get_last_lr()`、`scheduler.last_epoch`）、用优化器构造的对象的方法（`policy = WarmupPolicy(optimizer, lr)` 之后的 `policy.step_update(n)`）；以及步骤函数的调用方（沿优化器被传递的调用链向上）在调用之后的上述写入（`fit` 中 `train_step(model, batch, optimizer, scaler)` 之后、或调用它的 `run_epoch(...)` 之后的 `scheduler.step()`；调用传入的模型不是调用方可以等待的名字时以 RPM108 拒绝）；在训练器类自身的文件中、类之外通过实例对其步骤所用状态的使用（`trainer.train_step(x, y)` 之后的 `trainer.scheduler.get_last_lr()`）',
            "在其前面插入 `model.synchronize()`（训练器的状态则通过实例：`trainer.model.synchronize()`），使它们像原脚本一样在正在运行的步骤之后执行（`--exact` 下不插入：`model.step` 返回时步骤已经完成）",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        for group in optimizer.param_groups:\n            group["lr"] *= 0.9\n',
            expect=("        model.synchronize()\n        for group in optimizer.param_groups:",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        scheduler.step()\n        optimizer.zero_grad()\n        print(scheduler.get_last_lr())\n',
            expect=(
                "            scheduler.step()\n",
                "        model.synchronize()\n        print(scheduler.get_last_lr())",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches, path):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        scheduler.step()\n        optimizer.zero_grad()\n        epoch = scheduler.last_epoch\n        torch.save(optimizer.state_dict(), path)\n',
            expect=(
                "        model.synchronize()\n        epoch = scheduler.last_epoch\n        torch.save(optimizer.state_dict(), path)",
            ),
        ),
        Example(
            'import torch\n\n\nclass Policy:\n    def __init__(self, optimizer):\n        self.optimizer = optimizer\n\n    def step_update(self, n):\n        for group in self.optimizer.param_groups:\n            group["lr"] = 0.1 / (1 + n)\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    policy = Policy(optimizer)\n    scaler = torch.amp.GradScaler("cuda")\n    for n, (x, y) in enumerate(batches):\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        policy.step_update(n)\n',
            expect=("        model.synchronize()\n        policy.step_update(n)",),
        ),
        Example(
            'import torch\n\n\ndef train_step(model, x, optimizer, scaler):\n    with torch.autocast("cuda"):\n        loss = model(x).sum()\n    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n    optimizer.zero_grad()\n\n\ndef fit(model, batches, optimizer, scheduler, scaler):\n    for x in batches:\n        train_step(model, x, optimizer, scaler)\n        scheduler.step()\n\n\ndef main(batches):\n    model = torch.nn.Linear(4, 4)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)\n    scaler = torch.amp.GradScaler("cuda")\n    fit(model, batches, optimizer, scheduler, scaler)\n',
            expect=(
                "        train_step(model, x, optimizer, scaler)\n        model.synchronize()\n        scheduler.step()",
            ),
        ),
        Example(
            'import torch\n\n\nclass Trainer:\n    def __init__(self, model):\n        self.model = model\n        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, 2)\n        self.scaler = torch.amp.GradScaler("cuda")\n\n    def train_step(self, x):\n        with torch.autocast("cuda"):\n            loss = self.model(x).sum()\n        self.scaler.scale(loss).backward()\n        self.scaler.step(self.optimizer)\n        self.scaler.update()\n        self.scheduler.step()\n        self.optimizer.zero_grad()\n\n\ndef main(batches):\n    trainer = Trainer(torch.nn.Linear(4, 4))\n    for x in batches:\n        trainer.train_step(x)\n        print(trainer.scheduler.get_last_lr())\n',
            expect=("        trainer.model.synchronize()\n        print(trainer.scheduler.get_last_lr())",),
        ),
        Example(
            'import torch\n\nmodel = torch.nn.Linear(2, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor group in optimizer.param_groups:  # no GradScaler step: nothing to order\n    group["lr"] = 0.01\n',
        ),
    ),
)


def order_optimizer_writes(step: "StepBuilder", recognised: "RecognisedStep", skipped: Set[cst.CSTNode]) -> None:
    """Main-thread writes of the ``recognised`` step's optimizer state (lr loops, scheduler
    steps, helpers given the optimizer) in the step's function, after the wrap where the optimizer is built, and
    in the callers of the step's function after their call (up the chain the optimizer is
    handed along: :mod:`migrate.step_callers`) wait for the running step first (``model.synchronize()`` before them); the
    ``skipped`` statements are the step's own. :class:`Blocked` (RPM108) for a caller's
    write when the call hands the model as no name the caller can wait on. Nothing for a step whose shape leaves the
    ordering to another rule (``step.orders_optimizer_writes``). A trainer instance's step
    state used outside its class in this file (:mod:`migrate.instance_reads`) waits through
    the instance's model."""
    if not step.orders_optimizer_writes:
        return
    facts = step.facts
    places, trainers = write_places(step, recognised)
    for root, name, model_name, anchors in places:

        def its_scheduler(owner: str, at: cst.CSTNode, name: str = name) -> bool:
            return is_scheduler(step.rules, owner, at) and multi_step.schedules(step, owner, at, name)

        for statement in optimizer_writes(facts, root, name, its_scheduler, skipped, trainers):
            if anchors is None or any(may_run_after(step.facts, statement, anchor) for anchor in anchors):
                if model_name is None:
                    raise _no_model_handle(statement, anchors)
                step.rules.plan.synchronize_before.append((statement, model_name))
    for built, _ in step.builds:  # `trainer.scheduler.get_last_lr()` after `trainer.train_step(x, y)`
        if isinstance(built.scope, InstanceFamily):
            uses = outside_state_uses(built.scope, recognised.optimizer, recognised.model)
            step.rules.plan.synchronize_before.extend(uses)


def write_places(step: "StepBuilder", recognised: "RecognisedStep") -> Tuple[List[WritePlace], Set[str]]:
    """Every place the ``recognised`` step's optimizer may be used on the main thread: the
    step's function, the callers that built the optimizer, the callers of the step's
    function up the chain the optimizer is handed along, a trainer's methods, a state
    object's functions, aliases; with the names of the functions on the caller chain (their
    calls run the step)."""
    optimizer, model = recognised.optimizer, recognised.model
    facts = step.facts
    function = facts.enclosing(step.backward, (cst.FunctionDef,))
    trainer = function.name.value if isinstance(function, cst.FunctionDef) else None
    trainers = {trainer} if trainer else set()
    places = [WritePlace(function or facts.module, optimizer, model, [step.backward])]
    states = step.rules.state_objects
    for built, model_outer in step.builds:
        if isinstance(built.scope, InstanceFamily):
            places[:] = instance_places(built.scope, function, step.backward, optimizer, model)
            if built.name != optimizer:  # `opt = self.opt` in the step's method; the others write `self.opt`
                places += instance_places(built.scope, function, step.backward, built.name, model)
        if built.scope is facts.scope(step.backward) or not trainer or built.name == INLINE:
            continue
        scope = built.scope
        root: cst.CSTNode = (facts.function_of(scope) if isinstance(scope, Scope) else None) or facts.module
        # `train(...)`, or `t.train_step(...)` for a method (a trainer built with the objects)
        calls: List[cst.CSTNode] = [
            c
            for c in facts.subtree(root, cst.Call)
            if m.matches(c.func, m.Name(trainer) | m.Attribute(attr=m.Name(trainer)))
        ]
        places.append(WritePlace(root, built.name, model_outer, calls))
    if isinstance(function, cst.FunctionDef):
        # `fit` calls `train_step(model, batch, optimizer, scaler)`, then steps the scheduler
        callers, chain = caller_places(step.rules, function, optimizer, model)
        trainers |= chain
        for c in callers:
            for name in [c.optimizer, *sorted(spellings(facts, c.optimizer, c.call) - {c.optimizer})]:
                same = [p.anchors for p in places if p.root is c.root and p.optimizer == name and p.anchors is not None]
                if same:  # the place that built the optimizer: its writes wait after this call too
                    same[0].append(c.call)
                else:
                    places.append(WritePlace(c.root, name, c.model, [c.call]))
    # a state object's optimizer: every function holding the state may write it anytime
    places += states.places(optimizer, model, step.backward)
    # `opt = optimizer`: writes through an alias bound once in the step's scope
    places += [
        WritePlace(function or facts.module, alias, model, [step.backward])
        for alias in sorted(spellings(facts, optimizer, step.backward) - {optimizer})
    ]
    return places, trainers


def _no_model_handle(statement: cst.CSTNode, anchors: Optional[List[cst.CSTNode]]) -> Blocked:
    """The refusal of a caller's write that may race with the step of the function it calls,
    when the call hands the model as no name the caller could synchronize."""
    call = code(anchors[0]).strip() if anchors else "the call"
    return Blocked(
        statement,
        "RPM108",
        f"`{code(statement).strip()}` touches optimizer state after `{call}`, whose step runs on the "
        "optimizer thread, and the call hands the model as no name this function could wait on "
        "(`model.synchronize()`); use --exact or migrate it by hand",
    )
