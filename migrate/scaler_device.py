"""A GradScaler's device argument, mapped onto ``enabled=`` (issue 15).

torch's ``GradScaler(device, init_scale, growth_factor, backoff_factor, growth_interval,
enabled)`` takes the device first (``"cuda"`` by default; the legacy ``torch.cuda.amp`` and
``torch.cpu.amp`` wrappers imply it) and disables itself on a machine where that device is
CUDA and CUDA is missing. Upstream RoundPipe's ``GradScaler(init_scale, growth_factor,
backoff_factor, growth_interval, enabled)`` has no device: a device string passed first
would become its ``init_scale``. So the device is dropped and what it decided is kept in
``enabled``:

* ``"cuda"`` or no device (torch's default): ``enabled=torch.cuda.is_available()``, and'ed
  with the original ``enabled=`` when there is one;
* any other literal (``"cpu"``, ``"cuda:0"``, ``"xpu"``): nothing to add (torch compares the
  device with the string ``"cuda"`` only; it also stays enabled where ``torch_xla`` is
  installed, which is not reproduced);
* a device held in an expression ``d``: ``enabled=d != "cuda" or torch.cuda.is_available()``,
  and'ed likewise.

The remaining positional arguments keep their places: upstream's order is torch's after the
device. :func:`upstream_arguments` returns None (the caller keeps the device as written,
valid for this distribution's GradScaler only) when it cannot map with certainty: ``enabled``
given positionally, ``*args``/``**kwargs``, a comment on the device argument, or a module
without ``import torch`` for the added check. The warning torch prints when it
disables itself is not reproduced.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ImportAssignment

from .names import ModuleFacts, ScalerKind
from .syntax import code

__all__ = ["has_plain_torch", "upstream_arguments"]

_CUDA_CHECK = "torch.cuda.is_available()"
_POSITIONAL_AFTER_DEVICE = 4  # init_scale, growth_factor, backoff_factor, growth_interval


Rebuild = Callable[[Sequence[cst.Arg]], List[cst.Arg]]


def upstream_arguments(facts: ModuleFacts, call: cst.Call, kind: ScalerKind) -> Optional[Rebuild]:
    """For the torch constructor ``call`` (of the analysed tree): a function turning its
    (updated) arguments into those of ``roundpipe.GradScaler``, the device folded into
    ``enabled=``; None where that cannot be done exactly."""
    args = list(call.args)
    if any(arg.star for arg in args) or not has_plain_torch(facts, call):
        return None
    dropped: List[int] = []
    device: Optional[cst.BaseExpression] = None
    if kind.implied_device is not None:
        device = cst.SimpleString(f'"{kind.implied_device}"')
    elif args and args[0].keyword is None:
        device, dropped = args[0].value, [0]
    for index, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value == "device":
            device, dropped = arg.value, [*dropped, index]
    if any(m.findall(args[i], m.Comment()) for i in dropped):
        return None  # the comment on the device argument would be lost
    kept = [i for i in range(len(args)) if i not in dropped]
    if len([i for i in kept if args[i].keyword is None]) > _POSITIONAL_AFTER_DEVICE:
        return None  # enabled given positionally
    mapped, condition = _enabled_on(device)
    if not mapped:
        return None
    enabled = [i for i in kept if (keyword := args[i].keyword) is not None and keyword.value == "enabled"]

    def rebuild(updated: Sequence[cst.Arg]) -> List[cst.Arg]:
        new = [updated[i] for i in kept]
        if condition is None:
            return _without_trailing_comma(new, updated)
        if enabled:
            position = kept.index(enabled[0])
            if code(new[position].value) in (condition, "False"):  # nothing to add
                return _without_trailing_comma(new, updated)
            value = f"{_operand(new[position].value)} and {_operand_text(condition)}"
            new[position] = new[position].with_changes(value=cst.parse_expression(value))
            return _without_trailing_comma(new, updated)
        added = cst.Arg(value=cst.parse_expression(condition), keyword=cst.Name("enabled"), equal=_EQUAL)
        closing = new[-1].comma.whitespace_after if new and isinstance(new[-1].comma, cst.Comma) else None
        inner = updated[0].comma.whitespace_after if updated and isinstance(updated[0].comma, cst.Comma) else None
        if isinstance(closing, cst.ParenthesizedWhitespace) and isinstance(inner, cst.ParenthesizedWhitespace):
            # one argument a line, with a trailing comma: the new one gets a line of its own
            new[-1] = new[-1].with_changes(
                comma=cst.ensure_type(new[-1].comma, cst.Comma).with_changes(
                    whitespace_after=closing.with_changes(last_line=inner.last_line)
                )
            )
            added = added.with_changes(
                comma=cst.Comma(whitespace_after=closing.with_changes(first_line=cst.TrailingWhitespace()))
            )
        elif new:
            new[-1] = new[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return [*new, added]

    return rebuild


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _without_trailing_comma(new: List[cst.Arg], updated: Sequence[cst.Arg]) -> List[cst.Arg]:
    """A dropped last argument leaves no dangling ``, `` behind the new last one."""
    if new and updated and new[-1] is not updated[-1] and isinstance(updated[-1].comma, cst.MaybeSentinel):
        new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return new


def _enabled_on(device: Optional[cst.BaseExpression]) -> Tuple[bool, Optional[str]]:
    """(mapped, the condition the device adds to ``enabled``; None: none). torch disables a
    scaler whose device *is the string* ``"cuda"`` when CUDA is missing, nothing else."""
    if device is None:
        return True, _CUDA_CHECK  # torch's default device
    if isinstance(device, cst.SimpleString):
        value = device.evaluated_value
        return True, _CUDA_CHECK if (value.decode() if isinstance(value, bytes) else value) == "cuda" else None
    if isinstance(device, (cst.ConcatenatedString, cst.FormattedString)):
        return False, None
    return True, f'{_operand(device)} != "cuda" or {_CUDA_CHECK}'


def _operand(value: cst.BaseExpression) -> str:
    text = code(value)
    atomic = isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or bool(value.lpar)
    return text if atomic else f"({text})"


def _operand_text(condition: str) -> str:
    return condition if condition == _CUDA_CHECK else f"({condition})"


def has_plain_torch(facts: ModuleFacts, call: cst.Call) -> bool:
    """``torch`` at ``call`` is the module bound by a plain ``import torch``."""
    scope = facts.scope(call)
    bound = list(scope["torch"]) if scope is not None else []
    return bool(bound) and all(
        isinstance(a, ImportAssignment)
        and isinstance(a.node, cst.Import)
        and any(code(alias.name).split(".")[0] == "torch" and alias.asname is None for alias in a.node.names)
        for a in bound
    )
