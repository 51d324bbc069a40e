"""EMA / averaged copies of the wrapped model (issue 10, migrate/model_averages.py): each
shape real trainers write runs original against migrated. Under ``--exact`` the migrated
program prints the original's numbers, the EMA's own weights included; in the default form
an update inside the loop reads the weights one step old and never torn (checked against an
optimizer step slowed on its thread), and one after the loop waits for the last step."""

import time

import pytest
import torch

from migrate.engine import migrate_source
from script_runs import run_script

PROGRAM = """import copy

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

CLASSES


def ema_weights(module):
    return repr([float(p.detach().sum()) for p in module.parameters()])


def evaluate(net, x):
    net.eval()
    with torch.no_grad():
        value = float(net(x).float().sum())
    net.train()
    return value


def main():
    torch.manual_seed(0)
    model = NETWORK
    BEFORE
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    AFTER
    gen = torch.Generator().manual_seed(1)
    for i in range(6):
        x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = LOSS
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if i % EVERY == 0:
            UPDATE
        print("step", i, repr(loss.item()), "ema", ema_weights(MODULE))
    END
    probe = torch.ones(2, 4)
    print("eval", repr(evaluate(model, probe)), "ema", repr(evaluate(MODULE, probe)), ema_weights(MODULE))


main()
"""

SUBCLASS = '''class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """torchvision's EMA: an AveragedModel with an EMA average, buffers averaged too."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)'''

STATE_DICT_EMA = '''class ModelEma:
    """timm/yolo-style: a deep copy updated from the model's state_dict, with a ramped decay."""

    def __init__(self, model, decay=0.9):
        self.module = copy.deepcopy(model).eval()
        self.decay = decay
        self.updates = 0

    @torch.no_grad()
    def update(self, model):
        self.updates += 1
        d = self.decay * (1 - 0.5 ** self.updates)
        for e, p in zip(self.module.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(d).add_(p.detach(), alpha=1 - d)'''

KEPT_EMA = '''class EMA:
    """lucidrains-style: keeps the online model, lerps a deep copy towards it every k steps."""

    def __init__(self, model, beta=0.8, update_after_step=2):
        self.online_model = model
        self.ema_model = copy.deepcopy(model)
        self.ema_model.requires_grad_(False)
        self.beta, self.update_after_step, self.step = beta, update_after_step, 0

    @torch.no_grad()
    def update(self):
        self.step += 1
        if self.step <= self.update_after_step:
            self.ema_model.load_state_dict(self.online_model.state_dict())
            return
        for ema_p, p in zip(self.ema_model.parameters(), self.online_model.parameters()):
            ema_p.lerp_(p, 1.0 - self.beta)'''

MSE = "torch.nn.functional.mse_loss(model(x), y)"

SHAPES = {
    "averaged_model_multi_avg_fn": dict(
        AFTER="ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.8), use_buffers=True)",
        UPDATE="ema.update_parameters(model)",
        MODULE="ema",
    ),
    "torchvision_subclass_with_warmup_reset": dict(
        CLASSES=SUBCLASS,
        AFTER="ema = ExponentialMovingAverage(model, decay=0.7)",
        UPDATE="ema.update_parameters(model)\n            if i < 2:\n                ema.n_averaged.fill_(0)",
        EVERY="2",
        MODULE="ema",
    ),
    "state_dict_ema_built_before_the_optimizer": dict(
        CLASSES=STATE_DICT_EMA, BEFORE="ema = ModelEma(model)", UPDATE="ema.update(model)", MODULE="ema.module"
    ),
    "kept_model_every_k_steps_and_after_the_loop": dict(
        CLASSES=KEPT_EMA,
        AFTER="ema = EMA(model)",
        UPDATE="ema.update()",
        EVERY="2",
        END="ema.update()",
        MODULE="ema.ema_model",
    ),
}

NETWORK = "torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))"
DEFAULTS = dict(
    NETWORK=NETWORK, CLASSES="", BEFORE="pass", AFTER="pass", LOSS=MSE, EVERY="1", UPDATE="pass", END="pass"
)


def _program(shape: str, **changes: str) -> str:
    source = PROGRAM
    for key, value in {**DEFAULTS, **SHAPES[shape], **changes}.items():
        source = source.replace(key, value)
    return source


def _migrated(source: str, exact: bool) -> str:
    result = migrate_source(source, "train.py", exact=exact)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert migrate_source(result.migrated, "train.py", exact=exact).migrated == result.migrated
    return result.migrated


@pytest.fixture
def slow_step(monkeypatch):
    """The optimizer thread's step sleeps first: a read that does not wait sees old weights,
    and one racing with the step would see them half written."""
    plain_step = torch.optim.SGD.step

    def slowed(self, closure=None):
        time.sleep(0.03)
        return plain_step(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", slowed)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_exact_migration_prints_the_originals_numbers_and_ema_weights(shape, tmp_path):
    source = _program(shape)
    migrated = _migrated(source, exact=True)
    assert "model.model" in migrated  # the EMA follows the wrapped module
    original = run_script(source, tmp_path, "original.py")
    assert original.count("step ") == 6
    assert run_script(migrated, tmp_path, "exact.py") == original


@pytest.mark.parametrize("shape", list(SHAPES))
def test_default_migration_runs_as_many_steps_with_a_slowed_optimizer(shape, slow_step, tmp_path):
    source = _program(shape)
    migrated = _migrated(source, exact=False)
    original = run_script(source, tmp_path, "original.py").splitlines()
    asynchronous = run_script(migrated, tmp_path, "async.py").splitlines()
    assert len(asynchronous) == len(original) == 7


# The weight-independent loss (the gradient of sum(model(x)) does not depend on the weights
# for a linear model) makes every step's weights the same however stale the forward is; with
# decay 0 the EMA is a copy of the weights it read.
LINEAR = dict(NETWORK="torch.nn.Linear(4, 2)", LOSS="model(x).float().sum()")


def test_an_update_in_the_loop_reads_the_previous_steps_weights_whole(slow_step, tmp_path):
    source = _program("state_dict_ema_built_before_the_optimizer", **LINEAR).replace(
        "ModelEma(model)", "ModelEma(model, decay=0.0)"
    )
    original = [line.split(" ema ")[1] for line in run_script(source, tmp_path, "o.py").splitlines()[:6]]
    asynchronous = run_script(_migrated(source, exact=False), tmp_path, "a.py").splitlines()[:6]
    # update k reads the weights after step k-1 (one step stale), never a mix of two steps
    assert [line.split(" ema ")[1] for line in asynchronous[1:]] == original[:-1]


def test_an_update_after_the_loop_waits_for_the_last_step(slow_step, tmp_path):
    source = _program("kept_model_every_k_steps_and_after_the_loop", **LINEAR, UPDATE="pass").replace(
        "EMA(model)", "EMA(model, update_after_step=9)"
    )
    migrated = _migrated(source, exact=False)
    lines = migrated.splitlines()
    assert lines[lines.index("    ema.update()") - 1] == "    model.synchronize()"
    original = run_script(source, tmp_path, "o.py").splitlines()
    assert run_script(migrated, tmp_path, "a.py").splitlines()[-1] == original[-1]


def test_evaluating_the_model_and_the_ema_with_one_function_synchronizes_at_its_callers():
    source = _program("averaged_model_multi_avg_fn")
    migrated = _migrated(source, exact=False)
    evaluate = migrated[migrated.index("def evaluate") : migrated.index("def main")]
    assert "synchronize" not in evaluate
    assert '    model.synchronize()\n    print("eval", repr(evaluate(model, probe))' in migrated
