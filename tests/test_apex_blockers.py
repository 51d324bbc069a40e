"""Every blocker of an apex file is reported, each at the line that blocks, with a true cause
(issue 9): the apex rules collect independent blockers instead of stopping at the first, and
when setting apex up is what failed, the steps are checked only for their own blockers (a
step is not blamed for the missing ``amp.initialize``)."""

from __future__ import annotations

from typing import List, Tuple

from migrate.engine import migrate_source

SEVERAL = """import torch
from apex import amp
from apex.optimizers import FusedLAMB

model = torch.nn.Linear(4, 1)
optimizer = FusedLAMB(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
for x in torch.randn(3, 2, 4):
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer, delay_unscale=True) as scaled:
        scaled.backward()
    optimizer.step()
print(amp._amp_state.loss_scalers[0].loss_scale())
"""

SET_UP_FAILS = """import torch
from apex import amp

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
amp.initialize(model, optimizer, opt_level="O2")
for x in torch.randn(3, 2, 4):
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
        print("inside")
    optimizer.step()
for x in torch.randn(3, 2, 4):
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
"""


def _reported(source: str) -> List[Tuple[int, str]]:
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    return [(d.line, d.code) for d in result.diagnostics]


def _line(source: str, text: str) -> int:
    return source[: source.index(text)].count("\n") + 1


def test_every_independent_blocker_is_reported_at_its_line() -> None:
    assert _reported(SEVERAL) == [
        (_line(SEVERAL, "FusedLAMB(model"), "RPM201"),
        (_line(SEVERAL, "    with amp.scale_loss"), "RPM201"),  # delay_unscale=True
        (_line(SEVERAL, "print(amp._amp_state"), "RPM201"),
    ]
    messages = [d.message for d in migrate_source(SEVERAL, "train.py").diagnostics]
    assert "FusedLAMB" in messages[0] and "delay_unscale" in messages[1] and "_amp_state" in messages[2]


def test_a_failed_set_up_blames_no_step_but_steps_keep_their_own_blockers() -> None:
    reported = _reported(SET_UP_FAILS)
    assert reported == [
        (_line(SET_UP_FAILS, "amp.initialize"), "RPM201"),
        (_line(SET_UP_FAILS, "    with amp.scale_loss"), "RPM130"),  # the block holds more than backward
    ]


def test_one_blocker_alone_is_reported_as_before() -> None:
    single = SEVERAL.replace(", delay_unscale=True", "").replace(
        "print(amp._amp_state.loss_scalers[0].loss_scale())\n", ""
    )
    assert _reported(single) == [(_line(single, "FusedLAMB(model"), "RPM201")]
