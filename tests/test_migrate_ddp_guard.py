"""A data-parallel script migrated for one process (issue 10, shape 10): the single-process
path prints the original's numbers and checkpoint keys; the DDP branch stops with a clear
error before any DistributedDataParallel is built; an unguarded wrap is still refused."""

import contextlib
import io

import pytest

from migrate.engine import migrate_source

SCRIPT = """
import contextlib
import io

import torch
import torch.nn.functional as F


def main(distributed):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    model_without_ddp = model
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
        model_without_ddp = model.module
    optimizer = torch.optim.SGD(model_without_ddp.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        x, y = torch.randn(6, 4, generator=gen), torch.randint(0, 2, (6,), generator=gen)
        update = step % 2 == 1
        with model.no_sync() if distributed and not update else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / 2
            scaler.scale(loss).backward()
        if update:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")
    buffer = io.BytesIO()
    torch.save(model_without_ddp.state_dict(), buffer)
    print(sorted(torch.load(io.BytesIO(buffer.getvalue()))), model_without_ddp.state_dict()["0.bias"].tolist())
"""


def _run(source, distributed):
    namespace = {}
    exec(compile(source, "train.py", "exec"), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace["main"](distributed)
    return out.getvalue()


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "default"])
def test_the_single_process_path_prints_the_originals_numbers_and_keys(exact):
    result = migrate_source(SCRIPT, "train.py", exact=exact)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    original, migrated = _run(SCRIPT, False), _run(result.migrated, False)
    assert "'0.bias'" in original
    if exact:
        assert migrated == original
    else:
        assert migrated.count("step ") == original.count("step ") == 6
        assert migrated.splitlines()[-1].split("]")[0] == original.splitlines()[-1].split("]")[0]


def test_the_distributed_branch_stops_with_a_clear_error():
    migrated = migrate_source(SCRIPT, "train.py", exact=True).migrated
    with pytest.raises(RuntimeError, match="RoundPipe places the model itself; run this program as one process"):
        _run(migrated, True)


def test_an_unguarded_wrap_is_still_refused():
    source = SCRIPT.replace(
        "    if distributed:\n        model = torch", "    if True:\n        pass\n    model = torch"
    )
    source = source.replace("\n        model_without_ddp = model.module\n", "\n    model_without_ddp = model.module\n")
    result = migrate_source(source, "train.py")
    assert not result.changed
    assert "RPM101" in [d.code for d in result.diagnostics]


def test_a_builtin_name_as_the_context_is_no_sync_context_and_no_crash():
    """``with copyright:``: the name is bound nowhere in the file (libcst answers a builtin
    for it, which has no node to follow); the block is not a no_sync/nullcontext one, so the
    step after it is refused as for any other context (it crashed with RPM904 before)."""
    source = SCRIPT.replace("model.no_sync() if distributed and not update else contextlib.nullcontext()", "copyright")
    result = migrate_source(source, "train.py")
    assert not result.changed
    assert [d.code for d in result.diagnostics] == ["RPM106"]
