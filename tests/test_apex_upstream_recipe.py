"""The plain-code recipe of docs/apex.md ("Running on upstream RoundPipe") computes what the
compat migration computes, and needs nothing upstream RoundPipe 0.1.1 lacks.

Migrated apex scripts call ``roundpipe.compat``, which upstream does not have. Where
``amp.initialize``'s settings are literals, docs/apex.md tells users how to write the same
program with upstream's API only: the model cast as the opt level says, the optimizer on
``model.optim_parameters()``, inputs and outputs cast around the model (or autocast for O1),
and a ``roundpipe.GradScaler`` with apex's initial scale and growth interval.

Each case here is one small apex program (a small BatchNorm regressor with clipping on
``amp.master_params``, one batch whose targets overflow float16 gradients). It is migrated with
``roundpipe-migrate`` (the compat form), and written again by the recipe; both run on CPU,
and their per-step losses, final weights and final scale must be equal bit for bit, in
the default (asynchronous) form, and for O1 and O2 also in the ``--exact`` form (the plain
one with ``update()``, which upstream 0.1.1 has, after a waited-for step). Both run on
this project's runtime with the same kernels, so equality is exact; only the settings the recipe cannot express (a static scale
hit by an overflow, ``min_loss_scale``, the 2**24 cap after 16,000 clean steps) differ,
and those are documented, not tested here.
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from migrate.engine import migrate_source
from upstream_api import check_program

PRELUDE = '''
import torch
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
criterion = nn.MSELoss()
data = [(torch.randn(12, 6), torch.randn(12, 3) * (3000.0 if i == OVERFLOW_AT else 1.0))
        for i in range(6)]
LOSSES = []
'''

APEX = PRELUDE + '''
from apex import amp
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, optimizer = amp.initialize(model, optimizer, verbosity=0, {settings})
model.train()
for inputs, targets in data:
    optimizer.zero_grad()
    loss = criterion(model(inputs), targets)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
    LOSSES.append(loss.item())
'''

PLAIN = PRELUDE + '''
import roundpipe
NUM_MICROBATCH = 1
{cast}
model = roundpipe.RoundPipe(model, {optim_dtype}model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)
model.train()
amp_scaler = {scaler}
device_type = "cuda" if torch.cuda.is_available() else "cpu"
for inputs, targets in data:
    with {autocast}:
        def _loss_fn(output, targets):
            loss = criterion({output}, targets)
            return amp_scaler.scale(loss) / NUM_MICROBATCH
        loss = model.forward_backward(input_args=({inputs},), label=targets, loss_fn=_loss_fn) / amp_scaler.get_scale()
    def _step_fn():
        amp_scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)
        amp_scaler.step(optimizer)
        optimizer.zero_grad()
    model.step(_step_fn{step_suffix})
    amp_scaler.update()
    LOSSES.append(loss.item())
'''

CAST_O2 = '''
for _module in model.modules():  # apex O2: float16 weights; affine batchnorm stays float32
    if not (isinstance(_module, nn.modules.batchnorm._BatchNorm) and _module.affine):
        for _tensor in [*_module.parameters(recurse=False), *_module.buffers(recurse=False)]:
            if _tensor.is_floating_point():
                _tensor.data = _tensor.data.half()
'''

DYNAMIC = "roundpipe.GradScaler(init_scale=2.0**16, growth_interval=2000)"


@dataclass(frozen=True)
class Recipe:
    """One apex setting and its plain form (the fields fill :data:`PLAIN`)."""

    settings: str
    cast: str
    optim_dtype: str
    scaler: str
    inputs: str
    output: str
    autocast: str = "contextlib.nullcontext()"
    overflow_at: int = 3


RECIPES: Dict[str, Recipe] = {
    "O0": Recipe('opt_level="O0"', "model.float()", "", "roundpipe.GradScaler(enabled=False)",
                 "inputs.float()", "output.float()"),
    "O1": Recipe('opt_level="O1"', "", "", DYNAMIC, "inputs", "output",
                 autocast="torch.autocast(device_type)"),
    "O2": Recipe('opt_level="O2"', CAST_O2, "optim_dtype=torch.float32, ", DYNAMIC,
                 "inputs.half()", "output.float()"),
    "O2-static": Recipe('opt_level="O2", loss_scale=128.0', CAST_O2, "optim_dtype=torch.float32, ",
                        "roundpipe.GradScaler(init_scale=128.0, growth_interval=2**31 - 1)",
                        "inputs.half()", "output.float()", overflow_at=-1),
    "O3": Recipe('opt_level="O3"', "model.half()", "", "roundpipe.GradScaler(enabled=False)",
                 "inputs.half()", "output.float()", overflow_at=-1),
}


def _plain(recipe: Recipe, exact: bool) -> str:
    source = PLAIN.format(cast=recipe.cast, optim_dtype=recipe.optim_dtype, scaler=recipe.scaler,
                          inputs=recipe.inputs, output=recipe.output, autocast=recipe.autocast,
                          step_suffix=", is_async=False" if exact else "")
    return "import contextlib\n" + source.replace("OVERFLOW_AT", str(recipe.overflow_at))


def _compat(recipe: Recipe, exact: bool) -> str:
    source = APEX.format(settings=recipe.settings).replace("OVERFLOW_AT", str(recipe.overflow_at))
    result = migrate_source(source, "apex_program.py", exact=exact)
    assert result.status == "migrated", result.diagnostics
    assert "roundpipe.compat.initialize" in result.migrated
    return result.migrated


def _run(source: str, tmp_path: Path, name: str) -> Dict[str, Any]:
    path = tmp_path / name
    path.write_text(source)
    namespace = runpy.run_path(str(path), run_name="__main__")
    namespace["model"].synchronize()
    weights = [p.detach().clone() for p in namespace["model"].model.parameters()]
    return {"losses": namespace["LOSSES"], "weights": weights,
            "scale": namespace["amp_scaler"].get_scale()}


def _same_bits(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


# Every level in the default form; the --exact form where the scale moves (O1, O2).
CASES = [(level, False) for level in RECIPES] + [("O1", True), ("O2", True)]


@pytest.mark.parametrize("level, exact", CASES,
                         ids=[f"{level}-{'exact' if exact else 'default'}" for level, exact in CASES])
def test_plain_recipe_computes_what_the_compat_migration_computes(level: str, exact: bool,
                                                                  tmp_path: Path) -> None:
    recipe = RECIPES[level]
    compat = _run(_compat(recipe, exact), tmp_path, "compat.py")
    plain = _run(_plain(recipe, exact), tmp_path, "plain.py")
    assert plain["losses"] == compat["losses"]
    assert _same_bits(plain["weights"], compat["weights"])
    assert plain["scale"] == compat["scale"]
    assert len(set(plain["losses"])) > 1
    if recipe.scaler == DYNAMIC and recipe.overflow_at >= 0 and level != "O1":
        assert plain["scale"] == 2.0**15  # the float16 overflow was skipped and backed off


@pytest.mark.parametrize("level", list(RECIPES))
def test_plain_recipe_uses_only_upstream_api(level: str) -> None:
    report = check_program(_plain(RECIPES[level], exact=False))
    assert not report.violations, "\n".join(map(str, report.violations))
    assert not report.compat_names
