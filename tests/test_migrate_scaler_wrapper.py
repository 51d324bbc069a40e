"""Loss-scaler wrapper classes (issue 10, shape 2; migrate/scaler_wrapper.py): the rewrite of a
wrapper defined and used in one file and across files, the migrated programs printing the
original's numbers (``--exact``) or as many steps (default), and precise refusals."""

import contextlib
import io
import re
import runpy
import sys

import pytest

from migrate.engine import migrate_source
from migrate.prefilter import select_candidates
from migrate.project import migrate_project, project_view, wrapper_contexts
from migrate.scaler_wrapper import WrapperContext
from script_runs import run_script

STEP = re.compile(r"^step \d+ ", re.M)

# MAE/BEiT style: `if update_grad:` with clipping or a grad-norm helper, `else: norm = None`.
WRAPPER = """import torch


def get_grad_norm_(parameters, norm_type=2.0):
    parameters = [p for p in parameters if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type) for p in parameters]), norm_type)


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self, init_scale=2.0**10):
        self._scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if update_grad:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale in place
                norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            else:
                self._scaler.unscale_(optimizer)
                norm = get_grad_norm_(parameters)
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            norm = None
        return norm

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)
"""

# timm style: `scaler` attribute, `need_update`, clipping by value, nothing returned.
TIMM_WRAPPER = """import torch


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, need_update=True):
        self.scaler.scale(loss).backward(create_graph=create_graph)
        if need_update:
            if clip_grad is not None:
                self.scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_value_(parameters, clip_grad)
            self.scaler.step(optimizer)
            self.scaler.update()

    def state_dict(self):
        return self.scaler.state_dict()
"""

# The project's style: an early return on accumulation steps, the norm bound in the step only.
EARLY_RETURN_WRAPPER = WRAPPER.replace(
    """        if update_grad:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale in place
                norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            else:
                self._scaler.unscale_(optimizer)
                norm = get_grad_norm_(parameters)
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            norm = None
        return norm
""",
    """        if not update_grad:
            return None
        if clip_grad is not None:
            self._scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        else:
            self._scaler.unscale_(optimizer)
            norm = get_grad_norm_(parameters)
        self._scaler.step(optimizer)
        self._scaler.update()
        return norm
""",
)

TRAIN = """

def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_scaler = {wrapper}()
    gen = torch.Generator().manual_seed(3)
    for it in range(8):
        x, y = torch.randn(10, 6, generator=gen), torch.randint(0, 3, (10,), generator=gen)
        if it == 5:
            x[0, 0] = float("inf")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y) / 2
        update = it % 2 == 1
        norm = loss_scaler(loss, optimizer, {clip}parameters=model.parameters(), {flag}=update)
        if update:
            optimizer.zero_grad()
            print(f"step {{it}} loss {{loss.item()!r}} norm {{None if norm is None else norm.item()!r}}")
    print(f"final scale {{loss_scaler.state_dict()['scale']!r}}")


if __name__ == "__main__":
    main()
"""


def _program(wrapper_source: str, wrapper: str, clip: str, flag: str) -> str:
    return wrapper_source + TRAIN.format(wrapper=wrapper, clip=clip, flag=flag)


PROGRAMS = {
    "clipped": _program(WRAPPER, "NativeScalerWithGradNormCount", "clip_grad=0.5, ", "update_grad"),
    "grad_norm_helper": _program(WRAPPER, "NativeScalerWithGradNormCount", "", "update_grad"),
    "early_return": _program(EARLY_RETURN_WRAPPER, "NativeScalerWithGradNormCount", "clip_grad=0.5, ", "update_grad"),
    "timm_clip_value": _program(TIMM_WRAPPER, "NativeScaler", "clip_grad=0.01, ", "need_update"),
}


# ------------------------------------------------------------------------ rewrite text
def test_defined_wrapper_is_rewritten_with_its_users_in_one_file():
    result = migrate_source(PROGRAMS["clipped"], "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    text = result.migrated
    assert "    def __init__(self, init_scale=2.0**10, *, model):\n        self._model = model\n" in text
    assert "self._scaler = roundpipe.GradScaler(init_scale=init_scale, growth_interval=2)" in text
    assert (
        "        self._scaler.scale(loss).backward(create_graph=create_graph)\n        if update_grad:\n"
        "\n            def _step_fn():\n                nonlocal norm\n                if clip_grad is not None:\n"
    ) in text
    assert (
        "                self._scaler.step(optimizer)\n\n            self._model.step(_step_fn, is_async=False)\n"
        "            self._scaler.update()\n        else:\n            norm = None\n        return norm\n"
    ) in text
    assert "    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=3e-3)\n" in text
    assert "    loss_scaler = NativeScalerWithGradNormCount(model=model)\n" in text
    assert "parameters=model.optim_parameters(), update_grad=update)" in text
    assert "  # unscale in place" in text  # comments travel with the moved statements
    assert migrate_source(text, "train.py", exact=True).migrated == text  # idempotent


def test_a_wrapper_returning_the_norm_waits_for_its_step_also_without_exact():
    text = migrate_source(PROGRAMS["clipped"], "train.py").migrated
    assert "self._model.step(_step_fn, is_async=False)\n            self._scaler.update()\n" in text


def test_a_wrapper_returning_nothing_steps_asynchronously_by_default():
    text = migrate_source(PROGRAMS["timm_clip_value"], "train.py").migrated
    assert "            self._model.step(_step_fn)\n            self.scaler.update()\n" in text
    # the caller's zero_grad() would race with that step: the step is waited for after the call
    assert "=update)\n        model.synchronize()\n        if update:\n            optimizer.zero_grad()" in text


def test_a_norm_bound_only_in_the_step_is_bound_before_it():
    text = migrate_source(PROGRAMS["early_return"], "train.py", exact=True).migrated
    assert (
        "        if not update_grad:\n            return None\n        norm = None\n"
        "\n        def _step_fn():\n            nonlocal norm\n            if clip_grad is not None:\n"
    ) in text
    assert "        self._model.step(_step_fn, is_async=False)\n        self._scaler.update()\n" in text
    assert "        return norm\n" in text
    # bound elsewhere in __call__ (`else: norm = None`): no extra binding
    assert (
        "        if update_grad:\n\n            def _step_fn():\n"
        in migrate_source(PROGRAMS["clipped"], "t.py").migrated
    )


# ------------------------------------------------------------------------ execution
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_exact_migration_prints_the_originals_numbers(name, tmp_path):
    source = PROGRAMS[name]
    original = run_script(source, tmp_path, "original.py")
    assert len(STEP.findall(original)) == 4
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, "train.py")
    assert len(STEP.findall(run_script(default.migrated, tmp_path, "default.py"))) == 4


# A three-file project: the wrapper in util/misc.py, built in main.py, called in engine.py,
# checkpointed through a helper that only saves the model's state.
PROJECT = {
    "util/__init__.py": "",
    "util/misc.py": WRAPPER
    + """

def save_model(path, model, loss_scaler):
    torch.save({"model": model.state_dict(), loss_scaler.state_dict_key: loss_scaler.state_dict()}, path)
""",
    "engine.py": """import torch


def train_one_epoch(model, batches, optimizer, loss_scaler, accum_iter=2):
    for it, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y) / accum_iter
        update = (it + 1) % accum_iter == 0
        norm = loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters(), update_grad=update)
        if update:
            optimizer.zero_grad()
            print(f"step {it} loss {loss.item()!r} norm {norm.item()!r}")
""",
    "main.py": """import os
import tempfile

import torch

from engine import train_one_epoch
from util.misc import NativeScalerWithGradNormCount, save_model


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_scaler = NativeScalerWithGradNormCount()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen)) for _ in range(8)]
    train_one_epoch(model, batches, optimizer, loss_scaler)
    with tempfile.TemporaryDirectory() as folder:
        save_model(os.path.join(folder, "ckpt.pth"), model, loss_scaler)
        saved = torch.load(os.path.join(folder, "ckpt.pth"))
    print(sorted(saved["model"]), saved["amp_scaler"]["scale"])
    print(f"final scale {loss_scaler.state_dict()['scale']!r}")


if __name__ == "__main__":
    main()
""",
}


def test_project_contexts_name_builders_and_callers():
    contexts = wrapper_contexts(project_view(PROJECT))
    assert contexts["main.py"].classes == {"NativeScalerWithGradNormCount"}
    assert contexts["util/misc.py"].built_elsewhere == {"NativeScalerWithGradNormCount"}
    assert contexts["engine.py"] == WrapperContext(instance_params=frozenset({("train_one_epoch", "loss_scaler")}))


def test_project_wrapper_migrates_with_every_file_that_builds_or_calls_it():
    results = migrate_project(PROJECT, exact=True)
    assert {p: r.status for p, r in results.items() if p != "util/__init__.py"} == dict.fromkeys(
        ["util/misc.py", "engine.py", "main.py"], "migrated"
    )
    main = results["main.py"].migrated
    assert "    loss_scaler = NativeScalerWithGradNormCount(model=model)\n" in main
    assert (
        '        model.synchronize()\n        save_model(os.path.join(folder, "ckpt.pth"), model.model, loss_scaler)'
        in main
    )
    assert "train_one_epoch(model, batches, optimizer, loss_scaler)" in main  # the RoundPipe model
    assert "parameters=model.optim_parameters(), update_grad=update)" in results["engine.py"].migrated
    again = migrate_project({p: r.migrated for p, r in results.items()}, exact=True)
    assert all(not r.changed and not r.diagnostics for r in again.values())


def _run_project(files, tmp_path, name):
    folder = tmp_path / name
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    saved = list(sys.path)
    sys.path.insert(0, str(folder))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(folder / "main.py"), run_name="__main__")
    finally:
        sys.path[:] = saved
        for module in ("engine", "util", "util.misc"):
            sys.modules.pop(module, None)
    return out.getvalue()


def test_project_migration_prints_the_originals_numbers(tmp_path):
    original = _run_project(PROJECT, tmp_path, "original")
    exact = {p: r.migrated for p, r in migrate_project(PROJECT, exact=True).items()}
    assert _run_project(exact, tmp_path, "exact") == original
    default = {p: r.migrated for p, r in migrate_project(PROJECT).items()}
    assert len(STEP.findall(_run_project(default, tmp_path, "default"))) == len(STEP.findall(original)) == 4


def test_files_building_a_wrapper_are_looked_at_with_its_definition():
    paths = ["util/misc.py", "main.py", "engine.py", "other.py"]
    texts = [PROJECT["util/misc.py"], PROJECT["main.py"], PROJECT["engine.py"], "import os\n"]
    assert select_candidates(paths, texts) == [True, True, True, False]


# ------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "before,after,message",
    [
        (  # work before the backward
            "        self._scaler.scale(loss).backward(create_graph=create_graph)\n",
            "        loss = loss * 2\n        self._scaler.scale(loss).backward(create_graph=create_graph)\n",
            "__call__ must start with `self._scaler.scale(loss).backward()`",
        ),
        (  # update before step
            "            self._scaler.step(optimizer)\n            self._scaler.update()\n",
            "            self._scaler.update()\n            self._scaler.step(optimizer)\n",
            "must call self._scaler.step(optimizer) once, before update()",
        ),
        (  # the scale read inside the optimizer work
            "                norm = get_grad_norm_(parameters)\n",
            "                norm = get_grad_norm_(parameters) / self._scaler.get_scale()\n",
            "`self._scaler.get_scale()` in the optimizer work is not migrated",
        ),
        (  # another attribute of self shared with the step function
            "                norm = get_grad_norm_(parameters)\n",
            "                norm = get_grad_norm_(parameters)\n                self.last_norm = norm\n",
            "the optimizer work uses `self.last_norm`",
        ),
        (  # a second scaler attribute
            "    def state_dict(self):\n",
            "    def reset(self):\n        self._other = torch.amp.GradScaler('cpu')\n\n    def state_dict(self):\n",
            "its GradScaler must be built in __init__",
        ),
    ],
    ids=["work-before-backward", "update-before-step", "scale-in-step", "self-in-step", "second-scaler"],
)
def test_a_wrapper_of_another_shape_is_refused_precisely(before, after, message):
    source = PROGRAMS["grad_norm_helper"]
    assert before in source
    changed = source.replace(before, after, 1)
    result = migrate_source(changed, "train.py")
    assert result.migrated == changed
    assert [d.code for d in result.diagnostics] == ["RPM111"]
    assert message in result.diagnostics[0].message


def test_the_step_may_read_a_setting_of_the_wrapper():
    source = (
        PROGRAMS["clipped"]
        .replace(
            "        self._scaler = torch.amp.GradScaler(",
            "        self.max_norm = 0.5\n        self._scaler = torch.amp.GradScaler(",
        )
        .replace(
            "norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)",
            "norm = torch.nn.utils.clip_grad_norm_(parameters, self.max_norm)",
        )
    )
    assert "self.max_norm)" in source
    assert migrate_source(source, "train.py").status == "migrated"
    rebound = source.replace(
        "    def state_dict(self):\n",
        "    def tighten(self):\n        self.max_norm = 0.1\n\n    def state_dict(self):\n",
    )
    result = migrate_source(rebound, "train.py")
    assert [d.code for d in result.diagnostics] == ["RPM111"] and "`self.max_norm`" in result.diagnostics[0].message


def test_parameters_other_than_the_models_are_refused():
    source = PROGRAMS["clipped"].replace("parameters=model.parameters()", "parameters=model[0].parameters()")
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM111"]
    assert "`parameters=model[0].parameters()`" in result.diagnostics[0].message


def test_a_wrapper_nobody_builds_in_the_given_files_is_refused():
    result = migrate_source(WRAPPER, "util/misc.py")
    assert result.migrated == WRAPPER
    assert [d.code for d in result.diagnostics] == ["RPM111"]
    assert "run the tool on the whole project" in result.diagnostics[0].message


def test_an_optimizer_like_wrapper_is_not_taken_for_a_loss_scaler_wrapper():
    source = """import torch


class AMPOptimizer:
    def __init__(self, params):
        self.optimizer = torch.optim.Adam(params)
        self._grad_scaler = torch.amp.GradScaler("cpu")

    def backward(self, loss):
        self._grad_scaler.scale(loss).backward()

    def step(self):
        self._grad_scaler.step(self.optimizer)
        self._grad_scaler.update()
"""
    codes = [d.code for d in migrate_source(source, "amp_optimizer.py").diagnostics]
    assert "RPM111" not in codes and codes  # the scaler rules report it (RPM104/RPM105)


# ------------------------------------------------------------------------ timm's wrapper
# A stand-in for timm (the real one is not a test dependency): its NativeScaler as timm writes it.
FAKE_TIMM = {
    "timm/__init__.py": "",
    "timm/utils/__init__.py": """import torch


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self, device="cuda"):
        self._scaler = torch.amp.GradScaler(device)

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False,
                 need_update=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if need_update:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()
""",
}

TIMM_PROJECT = {
    "engine.py": PROJECT["engine.py"]
    .replace(
        "clip_grad=1.0, parameters=model.parameters(), update_grad=update)",
        "clip_grad=1.0, parameters=model.parameters())",
    )
    .replace("norm = loss_scaler(", "loss_scaler(")
    .replace(" norm {norm.item()!r}", ""),
    "main.py": PROJECT["main.py"]
    .replace(
        "from util.misc import NativeScalerWithGradNormCount, save_model\n", "from timm.utils import NativeScaler\n"
    )
    .replace("loss_scaler = NativeScalerWithGradNormCount()", 'loss_scaler = NativeScaler("cpu")')
    .replace(
        """    with tempfile.TemporaryDirectory() as folder:
        save_model(os.path.join(folder, "ckpt.pth"), model, loss_scaler)
        saved = torch.load(os.path.join(folder, "ckpt.pth"))
    print(sorted(saved["model"]), saved["amp_scaler"]["scale"])
""",
        "",
    ),
}


def test_timms_wrapper_becomes_the_roundpipe_drop_in_and_its_calls_follow():
    results = migrate_project(TIMM_PROJECT, exact=True)
    main, engine = results["main.py"].migrated, results["engine.py"].migrated
    assert 'loss_scaler = roundpipe.compat.NativeScaler("cpu", model=model, is_async=False)' in main
    assert "timm" not in main  # the import of the replaced class goes
    assert "parameters=model.optim_parameters())" in engine
    default = migrate_project(TIMM_PROJECT)["main.py"].migrated
    assert 'roundpipe.compat.NativeScaler("cpu", model=model)\n' in default


def test_timm_project_migration_prints_the_originals_numbers(tmp_path):
    original = _run_project({**TIMM_PROJECT, **FAKE_TIMM}, tmp_path, "original")
    sys.modules.pop("timm", None), sys.modules.pop("timm.utils", None)
    assert len(STEP.findall(original)) == 4
    exact = {p: r.migrated for p, r in migrate_project(TIMM_PROJECT, exact=True).items()}
    assert _run_project(exact, tmp_path, "exact") == original
    default = {p: r.migrated for p, r in migrate_project(TIMM_PROJECT).items()}
    assert len(STEP.findall(_run_project(default, tmp_path, "default"))) == 4


def test_the_model_handed_to_another_files_function_that_is_no_wrapper_user_still_refuses():
    project = dict(PROJECT)
    project["evaluation.py"] = "def evaluate(model, batches):\n    return [model(x) for x, _ in batches]\n"
    project["main.py"] = (
        PROJECT["main.py"]
        .replace("from engine import", "from evaluation import evaluate\nfrom engine import")
        .replace("    train_one_epoch(model,", "    evaluate(model, batches)\n    train_one_epoch(model,")
    )
    results = migrate_project(project, exact=True)
    assert [d.code for d in results["main.py"].diagnostics] == ["RPM110"]
    assert "evaluate() of evaluation.py" in results["main.py"].diagnostics[0].message
    assert not any(r.changed for r in results.values())


def test_checkpoint_helpers_called_through_a_module_alias_get_the_wrapped_module(tmp_path):
    project = dict(PROJECT)
    project["main.py"] = (
        PROJECT["main.py"]
        .replace(
            "from util.misc import NativeScalerWithGradNormCount, save_model\n",
            "import util.misc as misc\nfrom util.misc import NativeScalerWithGradNormCount\n",
        )
        .replace("        save_model(", "        misc.save_model(")
    )
    results = migrate_project(project, exact=True)
    assert 'misc.save_model(os.path.join(folder, "ckpt.pth"), model.model, loss_scaler)' in results["main.py"].migrated
    migrated = {p: r.migrated for p, r in results.items()}
    assert _run_project(migrated, tmp_path, "exact") == _run_project(project, tmp_path, "original")
