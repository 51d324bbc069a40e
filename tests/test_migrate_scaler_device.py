"""torch's GradScaler device argument folded into ``enabled=`` (issue 15): the migrated
constructor has upstream RoundPipe's signature and is enabled exactly where torch's was."""

from __future__ import annotations

import warnings

import pytest
import torch

import roundpipe
from migrate.engine import migrate_source
from upstream_api import check_program

SCRIPT = """import torch


def train(model, batches, device, amp):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = CONSTRUCTOR
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""

MAPPED = [
    ('torch.amp.GradScaler("cpu", init_scale=1024.0)', "roundpipe.GradScaler(init_scale=1024.0)"),
    ('torch.amp.GradScaler("cuda")', "roundpipe.GradScaler(enabled=torch.cuda.is_available())"),
    ("torch.amp.GradScaler()", "roundpipe.GradScaler(enabled=torch.cuda.is_available())"),
    ('torch.amp.GradScaler("cuda:0", 2.0**10, enabled=amp)', "roundpipe.GradScaler(2.0**10, enabled=amp)"),
    ('torch.amp.GradScaler("xpu")', "roundpipe.GradScaler()"),
    ('torch.GradScaler(device="cpu", growth_interval=10)', "roundpipe.GradScaler(growth_interval=10)"),
    (
        "torch.amp.GradScaler(device, enabled=amp == 1)",
        'roundpipe.GradScaler(enabled=(amp == 1) and (device != "cuda" or torch.cuda.is_available()))',
    ),
    (
        'torch.amp.GradScaler(torch.device("cuda"))',
        'roundpipe.GradScaler(enabled=torch.device("cuda") != "cuda" or torch.cuda.is_available())',
    ),
    (
        "torch.cuda.amp.GradScaler(2.0**10, 3.0)",
        "roundpipe.GradScaler(2.0**10, 3.0, enabled=torch.cuda.is_available())",
    ),
    ("torch.cpu.amp.GradScaler(enabled=amp)", "roundpipe.GradScaler(enabled=amp)"),
    (
        'torch.amp.GradScaler(\n        "cuda",\n        init_scale=2.0,  # small\n    )',
        "roundpipe.GradScaler(\n        init_scale=2.0,  # small\n        enabled=torch.cuda.is_available(),\n    )",
    ),
]


@pytest.mark.parametrize("constructor, expected", MAPPED)
def test_the_device_becomes_enabled_and_the_line_fits_upstream(constructor, expected):
    result = migrate_source(SCRIPT.replace("CONSTRUCTOR", constructor), "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert f"    scaler = {expected}\n" in result.migrated
    assert not [v for v in check_program(result.migrated).violations if "GradScaler(" in v.key]


@pytest.mark.parametrize(
    "constructor",
    [
        'torch.amp.GradScaler("cuda", 2.0, 2.0, 0.5, 100, amp)',  # enabled given positionally
        'torch.amp.GradScaler(\n        "cuda",  # the device\n    )',  # its comment would be lost
    ],
)
def test_a_device_that_cannot_be_mapped_exactly_is_kept(constructor):
    migrated = migrate_source(SCRIPT.replace("CONSTRUCTOR", constructor), "train.py").migrated
    assert "    scaler = " + constructor.replace("torch.amp.GradScaler", "roundpipe.GradScaler") in migrated


def test_without_import_torch_the_device_is_kept():
    source = SCRIPT.replace("import torch\n", "import torch.nn as nn\nfrom torch.amp import GradScaler\n", 1)
    source = source.replace("CONSTRUCTOR", 'GradScaler("cuda")').replace("torch.", "nn.").replace("nn.nn.", "nn.")
    migrated = migrate_source(source, "train.py").migrated
    assert 'roundpipe.GradScaler("cuda")' in migrated or migrated == source


@pytest.mark.parametrize("device", ["cpu", "cuda", None, "cuda:0", "torch.device('cuda')", "name"])
def test_the_mapped_scaler_is_enabled_where_torchs_is(device):
    """Evaluated here (CUDA or not): the migrated scaler is on exactly when torch's is."""
    arguments = "" if device is None else device if device in ("name", "torch.device('cuda')") else repr(device)
    constructor = f"torch.amp.GradScaler({arguments})"
    migrated = migrate_source(SCRIPT.replace("CONSTRUCTOR", constructor), "train.py").migrated
    line = next(line for line in migrated.splitlines() if "roundpipe.GradScaler(" in line)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_scaler = eval(constructor, {"torch": torch, "name": "cuda"})
        ours = eval(line.split("= ", 1)[1], {"torch": torch, "roundpipe": roundpipe, "name": "cuda"})
    assert ours.is_enabled() == torch_scaler.is_enabled()
