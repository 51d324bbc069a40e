"""apex's non-AMP pieces that travel with ``apex.amp``, each onto its torch form or refused.

* ``apex.optimizers.FusedAdam/FusedSGD/FusedAdagrad(...)`` -> ``torch.optim.AdamW``/``Adam``
  with ``fused=True`` (torch's fused Adam kernel, CUDA and CPU), ``SGD``/``Adagrad`` with
  ``foreach=True`` (torch's multi-tensor path; its fused Adagrad is CPU-only, and its fused
  SGD rounds differently from its other SGD paths). Every argument becomes a keyword of
  the same meaning; an argument with no torch counterpart that changes the update refuses
  the file (RPM201) with its name. The kernels differ from apex's CUDA multi-tensor ones:
  same update rule, not bit-for-bit the same floats on CUDA. ``set_grad_none`` is dropped: with torch >= 2.0
  both of apex's ``zero_grad`` branches set the gradients to None, as torch's does.
  ``FusedLAMB``, ``FusedNovoGrad``, ``FusedMixedPrecisionLamb`` have no torch optimizer:
  RPM201.
* ``apex.parallel.convert_syncbn_model(m[, process_group])`` ->
  ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(m[, process_group])`` (the same modules
  are converted; in one process it normalises as BatchNorm does); ``channel_last=True``
  (channels as the last dimension, which torch's SyncBatchNorm does not read) is RPM201.
* ``model = apex.parallel.DistributedDataParallel(model, ...)`` as the only statement of an
  ``if`` without ``else`` (``if world_size > 1:``): replaced by a ``raise RuntimeError``
  saying why, so the single-process path runs as before and the multi-process one stops
  with a clear error (RoundPipe runs in one process and places the model itself);
  unguarded it is refused (RPM101).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import libcst as cst
import libcst.matchers as m

from .ddp_guard import stop_guard
from .names import ModuleFacts
from .plan import Blocked, Plan
from .scaler_device import has_plain_torch
from .syntax import code, only_assignment

__all__ = ["EXTRAS", "plan_extra", "refusal"]


@dataclass(frozen=True)
class FusedOptimizer:
    """How one apex fused optimizer maps onto torch: its positional parameters (after
    ``params``), keywords renamed or kept, literal values required, keywords dropped."""

    positional: Tuple[str, ...]
    target: str  # the torch class (``adam_w_mode`` may switch AdamW -> Adam)
    flag: str  # "fused=True" or "foreach=True"
    kept: Tuple[str, ...]
    required: Dict[str, str]  # keyword -> the only literal accepted (its apex default)
    dropped: Tuple[str, ...] = ("set_grad_none",)


_ADAM = FusedOptimizer(
    positional=(
        "lr",
        "bias_correction",
        "betas",
        "eps",
        "adam_w_mode",
        "weight_decay",
        "amsgrad",
        "set_grad_none",
        "capturable",
        "master_weights",
    ),
    target="torch.optim.AdamW",
    flag="fused=True",
    kept=("lr", "betas", "eps", "weight_decay", "capturable"),
    required={"bias_correction": "True", "amsgrad": "False", "master_weights": "False"},
)
_SGD = FusedOptimizer(
    positional=(
        "lr",
        "momentum",
        "dampening",
        "weight_decay",
        "nesterov",
        "wd_after_momentum",
        "materialize_master_grads",
        "set_grad_none",
    ),
    target="torch.optim.SGD",
    flag="foreach=True",
    kept=("lr", "momentum", "dampening", "weight_decay", "nesterov"),
    required={"wd_after_momentum": "False", "materialize_master_grads": "True"},
)
_ADAGRAD = FusedOptimizer(
    positional=("lr", "eps", "weight_decay", "set_grad_none", "adagrad_w_mode"),
    target="torch.optim.Adagrad",
    flag="foreach=True",
    kept=("lr", "eps", "weight_decay"),
    required={"adagrad_w_mode": "False"},
)
_FUSED: Dict[str, FusedOptimizer] = {
    **dict.fromkeys(("apex.optimizers.FusedAdam", "apex.optimizers.fused_adam.FusedAdam"), _ADAM),
    **dict.fromkeys(("apex.optimizers.FusedSGD", "apex.optimizers.fused_sgd.FusedSGD"), _SGD),
    **dict.fromkeys(("apex.optimizers.FusedAdagrad", "apex.optimizers.fused_adagrad.FusedAdagrad"), _ADAGRAD),
}
_NO_TORCH_OPTIMIZER = ("FusedLAMB", "FusedNovoGrad", "FusedMixedPrecisionLamb")
_SYNCBN = "apex.parallel.convert_syncbn_model"
_DDP = ("apex.parallel.DistributedDataParallel", "apex.parallel.distributed.DistributedDataParallel")
_DDP_STOP = "apex DDP was removed by roundpipe-migrate: RoundPipe trains in one process on this machine"

#: every qualified name this module rewrites
EXTRAS = frozenset([*_FUSED, _SYNCBN, *_DDP])


def plan_extra(facts: ModuleFacts, plan: Plan, node: cst.CSTNode, qualified: str) -> None:
    """Plan the rewrite of one use (``node``, resolving to ``qualified``, in ``EXTRAS`` or an
    apex optimizer); :class:`Blocked` when it cannot be migrated exactly."""
    call = facts.parent(node)
    if not (isinstance(call, cst.Call) and call.func is node):
        raise Blocked(node, "RPM201", f"`{code(node)}` ({qualified}) is used other than by calling it; migrate by hand")
    if any(arg.star for arg in call.args):
        raise Blocked(
            call, "RPM201", f"`{code(node)}(*args/**kwargs)`: its arguments cannot be mapped; migrate by hand"
        )
    if qualified in _FUSED:
        _fused_optimizer(facts, plan, call, _FUSED[qualified])
    elif qualified == _SYNCBN:
        _syncbn(facts, plan, call)
    elif qualified in _DDP:
        _apex_ddp(facts, plan, call)


def refusal(node: cst.CSTNode, qualified: str) -> Optional[Blocked]:
    """The precise refusal for an apex optimizer without a torch counterpart, else None."""
    if qualified.startswith("apex.optimizers.") and qualified.rsplit(".", 1)[1] in _NO_TORCH_OPTIMIZER:
        return Blocked(
            node,
            "RPM201",
            f"`{code(node)}` ({qualified}): torch has no such optimizer (LAMB/NovoGrad); "
            "keep apex's optimizer or choose a torch one by hand",
        )
    return None


def _require_torch(facts: ModuleFacts, call: cst.Call) -> None:
    if not has_plain_torch(facts, call):
        raise Blocked(call, "RPM201", f"`{code(call.func)}` becomes a torch call, but this file has no `import torch`")


def _fused_optimizer(facts: ModuleFacts, plan: Plan, call: cst.Call, spec: FusedOptimizer) -> None:
    _require_torch(facts, call)
    target = spec.target
    keywords: List[Optional[str]] = []  # per argument: its torch keyword, "" to keep it as is, None to drop it
    for index, arg in enumerate(call.args):
        keyword = _parameter(call, index, arg, ("params", *spec.positional))
        text = code(arg.value)
        if keyword == "params":
            keywords.append("" if arg.keyword is None else "params")
        elif keyword == "adam_w_mode" and spec is _ADAM:
            if text not in ("True", "False"):
                raise Blocked(arg, "RPM201", "FusedAdam(adam_w_mode=...) must be a literal True/False (AdamW or Adam)")
            target = "torch.optim.AdamW" if text == "True" else "torch.optim.Adam"
            keywords.append(None)
        elif keyword in spec.required:
            if text != spec.required[keyword]:
                raise Blocked(
                    arg,
                    "RPM201",
                    f"`{code(call.func)}({keyword}={text})` changes the update in a way torch's "
                    f"{spec.target.rsplit('.', 1)[1]} has no option for; migrate by hand",
                )
            keywords.append(None)
        elif keyword in spec.kept:
            keywords.append(keyword)
        elif keyword in spec.dropped:
            keywords.append(None)
        else:
            raise Blocked(
                arg, "RPM201", f"`{code(call.func)}({keyword}=...)` is not an argument roundpipe-migrate maps"
            )
    if "" not in keywords and "params" not in keywords:
        raise Blocked(call, "RPM201", f"`{code(call.func)}` without its parameters")
    flag, value = spec.flag.split("=")
    _rewrite_call(plan, call, target, keywords, [(flag, value)])
    plan.rewrites.append((call, f"apex {code(call.func)} -> {target}({spec.flag})"))


def _syncbn(facts: ModuleFacts, plan: Plan, call: cst.Call) -> None:
    _require_torch(facts, call)
    keywords: List[Optional[str]] = []
    for index, arg in enumerate(call.args):
        keyword = _parameter(call, index, arg, ("module", "process_group", "channel_last"))
        if keyword == "channel_last":
            if code(arg.value) != "False":
                raise Blocked(
                    arg,
                    "RPM201",
                    "convert_syncbn_model(channel_last=...): torch's SyncBatchNorm reads channels "
                    "from dimension 1 only; migrate by hand",
                )
            keywords.append(None)
        else:
            keywords.append("" if keyword == "module" and arg.keyword is None else keyword)
    _rewrite_call(plan, call, "torch.nn.SyncBatchNorm.convert_sync_batchnorm", keywords, [])
    plan.rewrites.append((call, "apex convert_syncbn_model -> torch.nn.SyncBatchNorm.convert_sync_batchnorm"))


def _parameter(call: cst.Call, index: int, arg: cst.Arg, parameters: Tuple[str, ...]) -> str:
    """The parameter ``arg`` (the ``index``-th argument of ``call``) binds."""
    if arg.keyword is not None:
        return arg.keyword.value
    if index >= len(parameters):
        raise Blocked(call, "RPM201", f"`{code(call.func)}` with more positional arguments than it takes")
    return parameters[index]


def _rewrite_call(
    plan: Plan, call: cst.Call, target: str, keywords: List[Optional[str]], added: List[Tuple[str, str]]
) -> None:
    """``call`` calling ``target``: argument ``i`` kept as written (``keywords[i] == ""``), passed
    as ``keywords[i]=...`` or dropped (None); then the ``added`` keywords. A dropped argument
    that carries a comment refuses the file (the comment would be lost)."""
    for arg, keyword in zip(call.args, keywords):
        if keyword is None and m.findall(arg, m.Comment()):
            raise Blocked(arg, "RPM201", f"`{code(arg)}` is dropped but carries a comment; move the comment first")
    function = cst.parse_expression(target)

    def build(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        args = []
        for arg, keyword in zip(updated.args, keywords):
            if keyword is None:
                continue
            if keyword and arg.keyword is None:
                arg = arg.with_changes(keyword=cst.Name(keyword), equal=_EQUAL)
            args.append(arg)
        args += [
            cst.Arg(value=cst.parse_expression(value), keyword=cst.Name(name), equal=_EQUAL) for name, value in added
        ]
        args = [a.with_changes(comma=_COMMA) if a.comma is cst.MaybeSentinel.DEFAULT else a for a in args[:-1]] + [
            args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            if isinstance(updated.args[-1].comma, cst.MaybeSentinel)
            else args[-1]
        ]
        return updated.with_changes(func=function, args=args)

    plan.edits.replace_expression(call, build)


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def _apex_ddp(facts: ModuleFacts, plan: Plan, call: cst.Call) -> None:
    statement = facts.statement_of(call)
    guard = facts.parent(facts.parent(statement))
    if not (
        (assign := only_assignment(statement)) is not None
        and assign.value is call
        and isinstance(guard, cst.If)
        and guard.orelse is None
        and isinstance(guard.body, cst.IndentedBlock)
        and list(guard.body.body) == [statement]
    ):
        raise Blocked(
            call,
            "RPM101",
            "apex.parallel.DistributedDataParallel outside an `if <distributed>:` guard of its "
            "own: RoundPipe trains in one process and places the model itself; remove the wrapper",
        )
    stop_guard(plan, guard, _DDP_STOP)
    plan.rewrites.append((statement, "apex DistributedDataParallel under a guard -> RuntimeError (one process)"))
