"""Rule scaler_constructor: GradScaler constructions become roundpipe.GradScaler, positional arguments kept by meaning.

:func:`rewrite_constructor` plans one construction (the device folded into ``enabled=`` by
:mod:`migrate.scaler_device`); once every construction is planned,
:func:`drop_unused_scaler_imports` removes the ``GradScaler`` imports nothing else uses.
Both work on the shared context of a file's torch.amp rules
(:class:`~migrate.torch_amp.TorchAmpRules`: facts, the plan, the rewritten constructors),
which finds and follows the scalers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import libcst as cst
from libcst.metadata import Assignment

from ..names import ScalerKind
from ..scaler_device import upstream_arguments
from . import Example, Pattern, Rule

if TYPE_CHECKING:
    from ..torch_amp import TorchAmpRules

__all__ = ["RULE", "drop_unused_scaler_imports", "rewrite_constructor"]

RULE = Rule(
    name="scaler_constructor",
    order=10,
    description="GradScaler constructions become roundpipe.GradScaler, positional arguments kept by meaning",
    codes=("RPM104", "RPM105"),
    implemented_in=("rules/scaler_constructor.py", "scaler_device.py", "names.py", "torch_amp.py"),
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


def rewrite_constructor(rules: "TorchAmpRules", call: cst.Call, kind: Optional[ScalerKind]) -> None:
    """Plan ``call`` (a GradScaler construction of ``kind``) as ``roundpipe.GradScaler(...)``."""
    assert kind is not None  # what facts.scaler_kind says of a GradScaler construction
    upstream = upstream_arguments(rules.facts, call, kind)  # the device folded into enabled=

    def build(updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        if upstream is not None:
            args = upstream(args)
        elif kind.implied_device is not None:  # legacy wrappers: init_scale comes first
            device = cst.Arg(cst.SimpleString(f'"{kind.implied_device}"'))
            if args:
                device = device.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.insert(0, device)
        return updated.with_changes(func=cst.parse_expression("roundpipe.GradScaler"), args=args)

    rules.plan.edits.replace_expression(call, build)
    rules.rewritten_constructors.add(call)
    rules.plan.rewrites.append((call, "GradScaler -> roundpipe.GradScaler"))


def drop_unused_scaler_imports(rules: "TorchAmpRules") -> None:
    """Remove ``GradScaler`` from imports whose every use was a rewritten constructor
    (so migrated scripts keep no dead torch import)."""
    for call in rules.rewritten_constructors:
        # ``GradScaler(...)`` from ``from m import GradScaler``, or ``A.GradScaler(...)``
        # from ``import m as A``
        imported = call.func.value if isinstance(call.func, cst.Attribute) else call.func
        if not isinstance(imported, cst.Name):
            continue
        name = imported.value
        scope = rules.facts.scope(call)
        assignments = [a for a in scope[name] if isinstance(a, Assignment)] if scope is not None else []
        module_alias = imported is not call.func
        kind = cst.Import if module_alias else cst.ImportFrom
        if not assignments or not all(isinstance(a.node, kind) for a in assignments):
            continue
        uses = [r.node for a in assignments for r in a.references]
        if not all(_is_rewritten_constructor(rules, _attribute_of(rules, use, module_alias)) for use in uses):
            continue
        for assignment in assignments:
            assert isinstance(assignment.node, (cst.Import, cst.ImportFrom))  # each is a `kind`, checked above
            _drop_import_name(rules, assignment.node, name)


def _attribute_of(rules: "TorchAmpRules", use: cst.CSTNode, module_alias: bool) -> cst.CSTNode:
    """``A.GradScaler`` for a use of the module alias ``A`` (``use`` itself otherwise)."""
    parent = rules.facts.parent(use) if module_alias else None
    return parent if parent is not None else use


def _is_rewritten_constructor(rules: "TorchAmpRules", node: cst.CSTNode) -> bool:
    """``node`` is the callee of a constructor the rules rewrote."""
    parent = rules.facts.parent(node)
    return isinstance(parent, cst.Call) and parent.func is node and parent in rules.rewritten_constructors


def _drop_import_name(rules: "TorchAmpRules", statement: Union[cst.Import, cst.ImportFrom], name: str) -> None:
    """Drop ``name`` from the import ``statement`` (the whole line when it is its only name)."""
    if id(statement) in rules.dropped_imports:
        return
    rules.dropped_imports.add(id(statement))
    names = statement.names if isinstance(statement.names, (list, tuple)) else []
    kept = [a for a in names if (a.evaluated_alias or a.evaluated_name) != name]
    line = rules.facts.parent(statement)
    if kept and isinstance(line, cst.SimpleStatementLine):
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        rules.plan.edits.replace_expression(statement, lambda updated: updated.with_changes(names=kept))
    elif isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        rules.drop_line(line)
