"""The wrapped model's ``named_parameters()`` keep the original's names (migrate.wrapped_names).

A StyleGAN2-style ``accumulate(g_ema, generator)`` matches the EMA's parameters to the
model's by name after every step. Before, the migrated program got RoundPipe's
``model.``-prefixed names and failed with a ``KeyError``; now it reads the wrapped module's
own names and prints the original's numbers under ``--exact``.
"""

from migrate.engine import migrate_source
from script_runs import run_script

SCRIPT = """
import copy

import torch
import torch.nn.functional as F


def accumulate(model1, model2, decay=0.9):
    par1 = dict(model1.named_parameters())
    par2 = dict(model2.named_parameters())
    for k in par1.keys():
        par1[k].data.mul_(decay).add_(par2[k].data, alpha=1 - decay)


def main():
    torch.manual_seed(0)
    generator = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    g_ema = copy.deepcopy(generator)
    optimizer = torch.optim.Adam(generator.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    gen = torch.Generator().manual_seed(5)
    for step in range(5):
        x = torch.randn(6, 4, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(generator(x).float(), x.flip(1))
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        accumulate(g_ema, generator)
        print(f"step {step} loss {loss.item()!r} ema {sum(p.sum().item() for p in g_ema.parameters())!r}")


main()
"""


def test_an_ema_matched_by_name_sees_the_originals_names(tmp_path):
    original = run_script(SCRIPT, tmp_path, "original.py")
    exact = migrate_source(SCRIPT, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert "par2 = dict(model2.model.named_parameters())" in exact.migrated
    assert "par1 = dict(model1.named_parameters())" in exact.migrated
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(SCRIPT, "train.py")
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == original.count("step ") == 5


def test_an_ema_helper_also_given_the_plain_module_is_refused(tmp_path):
    source = SCRIPT.replace(
        "    optimizer = torch.optim.Adam(", "    accumulate(g_ema, generator, 0.0)\n    optimizer = torch.optim.Adam("
    )
    result = migrate_source(source, "train.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM139"]
