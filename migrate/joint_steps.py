"""Several optimizers stepped after one backward: one loss through several networks.

    with autocast(...):
        loss = criterion(decoder(encoder(x)), x)
    scaler.scale(loss).backward()
    scaler.unscale_(opt_enc); clip_grad_norm_(encoder.parameters(), 1.0)
    scaler.step(opt_enc)
    scaler.step(opt_dec)
    scaler.update()
    opt_dec.zero_grad()

Each optimizer trains one network (:meth:`StepBuilder.model_for`), so each network is wrapped
in RoundPipe and gets a step function of its own: the step group is cut into one contiguous
segment per optimizer (its unscale, clipping, step, zeroing and scheduler statements), each
planned as a step of the autograd form (the loss reaches every network, so the forward and
the backward stay as written); ``scaler.update()`` stays after the last step. The steps run
in their source order on the one optimizer thread, and statements of different optimizers
commute, so nothing they compute changes. A statement of an earlier optimizer after a later
one's segment ends the group (it stays on the main thread, ordered after the running step);
a statement the cut cannot attribute to exactly one optimizer refuses the step (RPM107).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst

from .multi_step import schedules, unsupported_group
from .plan import Binding, Blocked
from .recognised import RecognisedStep, StepGroup
from .syntax import names_in, only_expression
from .two_path import other_branch

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = ["plan_joint_steps", "steps_several"]


def steps_several(step: "StepBuilder", found: StepGroup) -> bool:
    """The group calls ``scaler.step`` more than once (one per optimizer, presumably)."""
    return step.autograd_form and [step.classify(s) for s in found.statements].count("step") > 1


def plan_joint_steps(step: "StepBuilder", found: StepGroup) -> None:
    """Plan one step function per optimizer of ``found`` (see the module docstring)."""
    group = list(found.statements)
    kinds = [step.classify(s) for s in group]
    optimizers = _stepped_optimizers(group, kinds)
    if (
        optimizers is None
        or len(set(optimizers)) != len(optimizers)
        or "guarded" in kinds
        or kinds.count("update") > 1
        or other_branch(step)
    ):
        raise unsupported_group(step, group, kinds)
    trained: Dict[str, Tuple[str, Binding, str]] = {}
    for optimizer in optimizers:
        model = step.model_for(optimizer)
        trained[optimizer] = (model, step.built, step.model_outer)  # both set by model_for
    if len({model for model, _, _ in trained.values()}) != len(trained):
        raise Blocked(group[0], "RPM107", "several optimizers of one model are stepped after one backward")
    owners = _owners(step, group, kinds, optimizers, {o: m for o, (m, _, _) in trained.items()})
    segments = _segments(group, kinds, owners)
    reason = Blocked(
        step.backward, "RPM107", f"one backward feeds the steps of several models ({', '.join(optimizers)})"
    )
    start = found.start
    for optimizer, count in segments:
        model, built, model_outer = trained[optimizer]
        step.built, step.model_outer = built, model_outer
        segment = StepGroup(
            found.block,
            start,
            start + count,
            tuple(group[start - found.start : start - found.start + count]),
            found.condition,
        )
        step.plan_autograd_form(RecognisedStep(segment, optimizer, model), reason)
        start += count
    step.trained = (optimizers[-1], trained[optimizers[-1]][0])


def _stepped_optimizers(group: List[cst.BaseStatement], kinds: List[Optional[str]]) -> Optional[List[str]]:
    """The optimizer of each ``scaler.step(optimizer)``, in order; None if one has other arguments."""
    found = []
    for statement, kind in zip(group, kinds):
        if kind == "step":
            call = only_expression(statement)
            if not isinstance(call, cst.Call) or len(call.args) != 1 or not isinstance(call.args[0].value, cst.Name):
                return None
            found.append(call.args[0].value.value)
    return found


def _owners(
    step: "StepBuilder",
    group: List[cst.BaseStatement],
    kinds: List[Optional[str]],
    optimizers: List[str],
    models: Dict[str, str],
) -> List[Optional[str]]:
    """The optimizer each statement works for (None: ``scaler.update()``); a statement naming
    none, or several, of the optimizers and their models refuses the step."""
    owners: List[Optional[str]] = []
    for statement, kind in zip(group, kinds):
        if kind == "update":
            owners.append(None)
            continue
        names: Set[str] = set(names_in(statement))
        if kind == "scheduler":
            scheduler = only_expression(statement).func.value.value  # type: ignore[union-attr]
            names |= {o for o in optimizers if schedules(step, scheduler, statement, o)}
        mine = [o for o in optimizers if o in names or models[o] in names]
        if len(mine) != 1:
            raise Blocked(
                statement,
                "RPM107",
                "this statement of the step group cannot be given to exactly one of the "
                f"optimizers {', '.join(optimizers)}; not migrated",
            )
        owners.append(mine[0])
    return owners


def _segments(
    group: List[cst.BaseStatement],
    kinds: List[Optional[str]],
    owners: List[Optional[str]],
) -> List[Tuple[str, int]]:
    """``(optimizer, number of statements)`` for each contiguous segment, in order. The update
    joins the segment it sits in (the last optimizer's: it must follow every step)."""
    last_step = max(i for i, kind in enumerate(kinds) if kind == "step")
    if "update" in kinds and kinds.index("update") < last_step:
        raise Blocked(group[kinds.index("update")], "RPM134", "scaler.update() before the last scaler.step()")
    segments: List[Tuple[str, int]] = []
    for position, owner in enumerate(owners):
        current = segments[-1][0] if segments else None
        if owner is None or owner == current:
            segments[-1] = (segments[-1][0], segments[-1][1] + 1)
            continue
        if owner in (o for o, _ in segments):
            if any(kind in ("unscale", "clip", "step") for kind in kinds[position:]):
                raise Blocked(
                    group[position],
                    "RPM107",
                    f"the statements of {owner!r} are interleaved with another optimizer's; not migrated",
                )
            break  # the rest stays on the main thread, ordered after the running steps
        segments.append((owner, 1))
    return segments
