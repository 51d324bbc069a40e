"""Where a model is handed to another trainer: DistributedDataParallel/DataParallel (also
through a helper function of the module), ``torch.compile``, EMA copies, ``deepcopy``.

A RoundPipe model must be the only thing that trains its weights, so the rules refuse a
file where such a wrapper is built from the model (before or after the RoundPipe wrap).
"""

from __future__ import annotations

import re
from typing import Optional, Set, Tuple

import libcst as cst

from .names import PARALLEL_WRAPPERS, ModuleFacts

__all__ = ["parallel_call", "other_trainer"]

_EMA = re.compile(r"(?:^|_)ema(?:_|\d|$)|Ema|EMA|MovingAverage|Averaged")

_OTHER_TRAINERS = {
    "torch.compile": "torch.compile builds a second model object from it",
    "copy.deepcopy": "a deep copy would be a second, untrained model",
    "torch.optim.swa_utils.AveragedModel": "an averaged (EMA/SWA) copy follows the old module",
}


def parallel_call(
    facts: ModuleFacts, node: cst.CSTNode, depth: int = 0, skip: Optional[cst.CSTNode] = None
) -> Optional[cst.Call]:
    """A DDP/DataParallel call under ``node``, directly or inside a function of this module
    that ``node`` calls (``model = wrap_distributed(model)``), else None; calls under
    ``skip`` (a guarded wrap the migration stops, :mod:`migrate.ddp_guard`) do not count."""
    for call in facts.subtree(node, cst.Call):
        if skip is not None and facts.within(call, skip):
            continue
        if facts.calls_any(call, PARALLEL_WRAPPERS):
            return call
        function = facts.local_function(call)
        if function is not None and depth < 3 and parallel_call(facts, function.body, depth + 1) is not None:
            return call
    return None


def other_trainer(facts: ModuleFacts, call: cst.Call) -> Optional[Tuple[str, str]]:
    """(diagnostic code, why) when handing the model to ``call`` makes another trainer of
    it (RPM101 for DDP/DataParallel, RPM114 otherwise), else None."""
    names = facts.qualified(call.func) | _local_class_bases(facts, call)
    for name in names:
        if name in _OTHER_TRAINERS:
            return "RPM114", _OTHER_TRAINERS[name]
    if names & PARALLEL_WRAPPERS or parallel_call(facts, call) is not None:
        return "RPM101", "DistributedDataParallel/DataParallel would train it outside RoundPipe"
    callee = call.func.attr.value if isinstance(call.func, cst.Attribute) else getattr(call.func, "value", "")
    if _EMA.search(str(callee)):
        return "RPM114", "an EMA copy built from it would follow the old module"
    return None


def _local_class_bases(facts: ModuleFacts, call: cst.Call) -> Set[str]:
    """The qualified names of the bases of the class of this module that ``call`` builds
    (``class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel)``), else none."""
    scope = facts.scope(call)
    if not isinstance(call.func, cst.Name) or scope is None:
        return set()
    bound = [getattr(a, "node", None) for a in scope[call.func.value]]
    classes = [node for node in bound if isinstance(node, cst.ClassDef)]
    return {name for klass in classes for base in klass.bases for name in facts.qualified(base.value)}
