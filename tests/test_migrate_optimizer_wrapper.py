"""Optimizer wrapper classes that own the scaler (issue 10, shapes 2 and 3; fairseq style;
migrate/optimizer_wrapper_class.py): the class and every file that builds it migrate together,
each method by what it does; the migrated programs print the original's numbers under
``--exact`` and run as many steps by default; what is not handled is refused precisely."""

import contextlib
import io
import pathlib
import re

import pytest

from migrate import cli
from migrate.engine import migrate_source
from script_runs import run_script

PROJECT = pathlib.Path(__file__).resolve().parent / "migrate_projects" / "optimizer_wrapper_class"
STEP = re.compile(r"^step \d+ ", re.M)

# fairseq's FP16 optimizer in spirit: retain_graph passed through, multiply_grads, a clip that
# returns the norm (used for a decision by the caller), lr passthroughs, the scaler's state
# under a key of the state dict.
FAIRSEQ_LIKE = '''import torch


class FP16LikeOptimizer:
    def __init__(self, params, lr):
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.01)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=3)

    def backward(self, loss, retain_graph=False):
        self.scaler.scale(loss).backward(retain_graph=retain_graph)

    def multiply_grads(self, c):
        """Multiply the (still scaled) gradients by ``c``."""
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(c)

    def clip_grad_norm(self, max_norm):
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # the unscaled norm
        return grad_norm

    def step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def zero_grad(self):
        self.optimizer.zero_grad()

    def get_lr(self):
        return self.optimizer.param_groups[0]["lr"]

    def set_lr(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self):
        state = self.optimizer.state_dict()
        state["loss_scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state):
        self.scaler.load_state_dict(state.pop("loss_scaler"))
        self.optimizer.load_state_dict(state)


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = FP16LikeOptimizer(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(5)
    for it in range(8):
        optimizer.set_lr(1e-2 * 0.8**it)
        optimizer.zero_grad()
        x, y = torch.randn(12, 8, generator=gen), torch.randint(0, 4, (12,), generator=gen)
        if it == 3:
            x[0, 0] = float("inf")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y, reduction="sum")
        optimizer.backward(loss)
        optimizer.multiply_grads(1.0 / y.numel())
        grad_norm = optimizer.clip_grad_norm(1.0)
        if torch.isfinite(grad_norm) and grad_norm > 0.68:
            optimizer.multiply_grads(0.5)
        optimizer.step()
        print(f"step {it} loss {loss.item()!r} gnorm {grad_norm.item()!r} lr {optimizer.get_lr()!r}")
    state = optimizer.state_dict()
    print(f"final scale {state['loss_scaler']['scale']!r}")


if __name__ == "__main__":
    main()
'''

# The wrapper handed an optimizer its caller keeps (and schedules): clipping inside step()
# under a condition, gradient accumulation, zero_grad's argument passed through.
HANDED_OPTIMIZER = """import torch


class AmpOptimizer:
    def __init__(self, optimizer, init_scale=2.0**8):
        self.optimizer = optimizer
        self._scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)

    def backward(self, loss):
        self._scaler.scale(loss).backward()

    def step(self, max_norm=None):
        if max_norm is not None:
            self._scaler.unscale_(self.optimizer)  # clip the true gradients
            torch.nn.utils.clip_grad_norm_(
                [p for group in self.optimizer.param_groups for p in group["params"]], max_norm
            )
        self._scaler.step(self.optimizer)
        self._scaler.update()

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def get_loss_scale(self):
        return self._scaler.get_scale()


def main():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = AmpOptimizer(base)
    scheduler = torch.optim.lr_scheduler.StepLR(base, step_size=2, gamma=0.7)
    gen = torch.Generator().manual_seed(11)
    update_freq = 2
    for it in range(12):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        if it == 6:
            x[1, 2] = float("nan")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y) / update_freq
        optimizer.backward(loss)
        if (it + 1) % update_freq == 0:
            optimizer.step(max_norm=0.5 if it % 4 == 1 else None)
            optimizer.zero_grad(set_to_none=it % 3 == 0)
            scheduler.step()
            for group in base.param_groups:
                group["momentum"] = 0.9 - 0.01 * it
            print(f"step {it} loss {loss.item()!r} scale {optimizer.get_loss_scale()!r}")
    print(f"final scale {optimizer.get_loss_scale()!r}")


if __name__ == "__main__":
    main()
"""

# A norm measured without clipping (max_norm=inf) and returned from an expression, a method
# handing the parameters to a grad-norm helper (it reads gradients: a step too), the scaler's
# state loaded from a checkpoint of the wrapper, clip_grad_norm skipped on some steps.
NORM_ONLY = """import math

import torch


def scaled_grad_norm(parameters):
    return torch.norm(torch.stack([p.grad.detach().norm() for p in parameters if p.grad is not None]))


class ScaledOptimizer:
    def __init__(self, params, lr):
        self.params = list(params)
        self.optimizer = torch.optim.Adam(self.params, lr=lr)
        self.grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**5, growth_interval=1)

    def backward(self, loss):
        self.grad_scaler.scale(loss).backward()

    def clip_grad_norm(self, max_norm):
        self.grad_scaler.unscale_(self.optimizer)
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm if max_norm > 0 else math.inf).item()

    def scaled_norm(self):
        return scaled_grad_norm(self.params)

    def step(self):
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()

    def zero_grad(self):
        self.optimizer.zero_grad()

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.grad_scaler.state_dict()}

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state["optimizer"])
        self.grad_scaler.load_state_dict(state["scaler"])


def main():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 2))
    optimizer = ScaledOptimizer(model.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(9)
    for it in range(9):
        if it == 5:
            optimizer.load_state_dict(optimizer.state_dict())
        optimizer.zero_grad()
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        optimizer.backward(loss)
        scaled = optimizer.scaled_norm()
        norm = optimizer.clip_grad_norm(0.0) if it % 3 else None
        optimizer.step()
        print(f"step {it} loss {loss.item()!r} norm {norm!r} scaled {scaled.item()!r}")
    print(f"final scale {optimizer.state_dict()['scaler']['scale']!r}")


if __name__ == "__main__":
    main()
"""

PROGRAMS = {"fairseq_like": FAIRSEQ_LIKE, "handed_optimizer": HANDED_OPTIMIZER, "norm_only": NORM_ONLY}


# ------------------------------------------------------------------------ execution
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_exact_migration_prints_the_originals_numbers(name, tmp_path):
    source = PROGRAMS[name]
    original = run_script(source, tmp_path, "original.py")
    steps = len(STEP.findall(original))
    assert steps >= 6
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, "train.py")
    assert default.status == "migrated", [d.format() for d in default.diagnostics]
    assert len(STEP.findall(run_script(default.migrated, tmp_path, "default.py"))) == steps
    for text in (exact.migrated, default.migrated):
        assert migrate_source(text, "train.py").migrated == text  # idempotent


def test_the_corpus_project_migrates_with_the_file_that_builds_the_wrapper(tmp_path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["--exact", "--exclude", "expected_exact", "-o", str(tmp_path), str(PROJECT)])
    assert code == 0, err.getvalue()
    wrapper = (tmp_path / "amp_optimizer.py").read_text()
    assert "    def __init__(self, params, lr, init_scale=2.0**7, scale_window=2, *, model):\n" in wrapper
    assert "        self._model.step(_step_fn, is_async=False)\n        return result\n" in wrapper
    assert (
        "    def zero_grad(self):\n        self._model.zero_grad()\n        self.fp32_optimizer.zero_grad()\n"
        in wrapper
    )
    main = (tmp_path / "main.py").read_text()
    assert "    optimizer = AMPOptimizer(model.optim_parameters(), lr=3e-3, model=model)\n" in main


# ------------------------------------------------------------------------ rewrite text
def test_each_method_migrates_by_what_it_does():
    text = migrate_source(FAIRSEQ_LIKE, "train.py").migrated
    # the backward stays on the caller's thread, its argument passed through
    assert "        self.scaler.scale(loss).backward(retain_graph=retain_graph)\n" in text
    # gradient work without a result: an asynchronous step; the docstring stays the method's
    assert (
        '        """Multiply the (still scaled) gradients by ``c``."""\n\n        def _step_fn():\n'
        "            for p in self.params:\n"
    ) in text
    assert "        self._model.step(_step_fn)\n" in text
    # a returned norm: computed in the step, waited for, returned after it; comments travel
    assert (
        "        result = None\n\n        def _step_fn_2():\n            nonlocal result\n"
        "            self.scaler.unscale_(self.optimizer)\n"
        "            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # the unscaled norm\n"
        "            result = grad_norm\n\n"
        "        self._model.step(_step_fn_2, is_async=False)\n        return result\n"
    ) in text
    assert "        self._model.step(_step_fn_3)\n        self.scaler.update()\n" in text
    # main-thread users of the optimizer wait for the running step
    assert "    def set_lr(self, lr):\n        self._model.synchronize()\n        for group in" in text
    assert "    def zero_grad(self):\n        self._model.synchronize()\n        self._model.zero_grad()\n" in text
    assert "    def get_lr(self):\n        self._model.synchronize()\n" in text


def test_exact_waits_for_every_step_and_adds_no_synchronize():
    text = migrate_source(FAIRSEQ_LIKE, "train.py", exact=True).migrated
    assert "self._model.step(_step_fn, is_async=False)" in text
    assert "self._model.step(_step_fn_3, is_async=False)\n        self.scaler.update()\n" in text
    assert "synchronize()" not in text


def test_writes_of_a_handed_optimizer_in_the_caller_wait_for_the_step():
    text = migrate_source(HANDED_OPTIMIZER, "train.py").migrated
    assert "    base = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)\n" in text
    assert "    optimizer = AmpOptimizer(base, model=model)\n" in text
    assert "            model.synchronize()\n            scheduler.step()\n" in text
    assert "            model.synchronize()\n            for group in base.param_groups:\n" in text
    assert "synchronize" not in migrate_source(HANDED_OPTIMIZER, "train.py", exact=True).migrated.split("def main")[1]


def test_a_returned_bare_value_stays_after_the_step():
    source = FAIRSEQ_LIKE.replace("        self.scaler.update()\n", "        self.scaler.update()\n", 1).replace(
        "                p.grad.mul_(c)\n", "                p.grad.mul_(c)\n        return None\n"
    )
    text = migrate_source(source, "train.py").migrated
    assert "                    p.grad.mul_(c)\n\n        self._model.step(_step_fn)\n        return None\n" in text


def test_a_method_handing_the_parameters_to_a_helper_runs_in_a_step():
    text = migrate_source(NORM_ONLY, "train.py").migrated
    assert (
        "    def scaled_norm(self):\n        result = None\n\n        def _step_fn_2():\n            nonlocal result\n"
        "            result = scaled_grad_norm(self.params)\n\n        self._model.step(_step_fn_2, is_async=False)\n"
    ) in text


def test_a_rebound_parameter_is_nonlocal_in_the_step_function():
    source = FAIRSEQ_LIKE.replace(
        "        self.scaler.unscale_(self.optimizer)\n        grad_norm",
        "        max_norm = float(max_norm)\n        self.scaler.unscale_(self.optimizer)\n        grad_norm",
    )
    text = migrate_source(source, "train.py", exact=True).migrated
    assert "            nonlocal max_norm, result\n            max_norm = float(max_norm)\n" in text


# ------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "before,after,message",
    [
        (
            "class FP16LikeOptimizer:",
            "class FP16LikeOptimizer(object):",
            "inherits from another class",
        ),
        (
            "    def get_lr(self):\n",
            "    @property\n    def grad_scaler(self):\n        return self.scaler\n\n    def get_lr(self):\n",
            "grad_scaler() hands the scaler on (`return self.scaler`)",
        ),
        (
            "backward(retain_graph=retain_graph)",
            "backward(create_graph=True)",
            "only retain_graph= and create_graph=<name> are kept",
        ),
        (
            "        self.scaler.unscale_(self.optimizer)\n        grad_norm",
            "        self.multiply_grads(1.0)\n        self.scaler.unscale_(self.optimizer)\n        grad_norm",
            "clip_grad_norm() calls multiply_grads(), another method of the wrapper",
        ),
        (
            "        self.scaler.step(self.optimizer)\n",
            "        self.scaler.step(self.optimizer, closure)\n",
            "must call self.scaler.step(self.<optimizer>) once",
        ),
        (
            "        self.scaler.step(self.optimizer)\n        self.scaler.update()\n",
            "        self.scaler.update()\n        self.scaler.step(self.optimizer)\n",
            "self.scaler.update() must end step()",
        ),
        (
            "    def multiply_grads(self, c):\n",
            "    @torch.no_grad()\n    def multiply_grads(self, c):\n",
            "multiply_grads() is decorated",
        ),
        (
            "        self.optimizer.zero_grad()\n",
            "        for p in self.params:\n            p.grad = None\n",
            "zero_grad() works on the gradients itself",
        ),
        (
            "    def get_lr(self):\n",
            "    @property\n    def wrapped_optimizer(self):\n        return self.optimizer\n\n    def get_lr(self):\n",
            "wrapped_optimizer() hands `self.optimizer` out, which the asynchronous step uses",
        ),
        (
            "    def get_lr(self):\n",
            "    @property\n    def param_groups(self):\n        return self.optimizer.param_groups\n\n"
            "    def get_lr(self):\n",
            "param_groups() hands `self.optimizer.param_groups` out",
        ),
        (
            "        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # the unscaled norm\n",
            "        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # the unscaled norm\n"
            "        if not torch.isfinite(grad_norm):\n            return None\n",
            "clip_grad_norm() returns early",
        ),
    ],
)
def test_a_variant_the_migration_does_not_handle_is_refused_precisely(before, after, message):
    assert before in FAIRSEQ_LIKE
    source = FAIRSEQ_LIKE.replace(before, after)
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    codes = [d.code for d in result.diagnostics]
    assert codes == ["RPM111"], [d.format() for d in result.diagnostics]
    assert message in result.diagnostics[0].message


def test_the_handed_out_optimizer_is_fine_when_every_step_is_waited_for():
    source = FAIRSEQ_LIKE.replace(
        "    def get_lr(self):\n",
        "    @property\n    def wrapped_optimizer(self):\n        return self.optimizer\n\n    def get_lr(self):\n",
    )
    assert migrate_source(source, "train.py", exact=True).status == "migrated"


def test_a_wrapper_nobody_builds_in_the_given_files_is_refused():
    source = (PROJECT / "amp_optimizer.py").read_text()
    result = migrate_source(source, "amp_optimizer.py")
    assert [d.code for d in result.diagnostics] == ["RPM111"]
    assert "optimizer wrapper AMPOptimizer is migrated together with the code that builds it" in (
        result.diagnostics[0].message
    )


def test_a_trainer_class_without_an_optimizers_interface_is_a_split_step_not_a_wrapper():
    """Without ``zero_grad`` the class is a trainer whose step is split over methods: that
    shape is followed (migrate/split_step.py), and what blocks it here is its optimizer,
    built on a list of parameters rather than on one model's."""
    source = (PROJECT / "amp_optimizer.py").read_text().replace("def zero_grad(self):", "def clear(self):")
    result = migrate_source(source, "amp_optimizer.py")
    assert [d.code for d in result.diagnostics] == ["RPM108"]
    assert "optimizer wrapper" not in result.diagnostics[0].message
    assert "(handed self.params, lr, no `.parameters()` in the call)" in result.diagnostics[0].message


def test_an_instance_used_outside_its_methods_is_refused_without_exact():
    source = FAIRSEQ_LIKE.replace(
        "        optimizer.step()\n",
        '        optimizer.step()\n        optimizer.optimizer.param_groups[0]["lr"] *= 0.9\n',
    )
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM111", "RPM111"]  # the class, and the use
    assert "an instance is used outside its methods (`optimizer.optimizer`" in result.diagnostics[0].message
    assert "`optimizer.optimizer` uses the optimizer wrapper's state" in result.diagnostics[1].message
    assert migrate_source(source, "train.py", exact=True).status == "migrated"  # every step waited for


def test_an_instance_used_outside_its_methods_in_another_file_refuses_both_files(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "amp_optimizer.py").write_text((PROJECT / "amp_optimizer.py").read_text())
    main = (PROJECT / "main.py").read_text()
    main = main.replace(
        "    optimizer.step()\n", '    optimizer.step()\n    optimizer.fp32_optimizer.param_groups[0]["lr"] *= 0.9\n'
    )
    (project / "main.py").write_text(main)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["-o", str(tmp_path / "out"), str(project)])
    assert code == 1 and not list((tmp_path / "out").rglob("*.py"))
    text = err.getvalue()
    assert "main.py:26:5: RPM111 `optimizer.fp32_optimizer` uses the optimizer wrapper's state" in text
    assert "amp_optimizer.py:6:1: RPM111 optimizer wrapper AMPOptimizer: an instance is used outside" in text


HANDED_SCALER_USER = """

def main(model):
    scaler = torch.amp.GradScaler("cpu")
    return AMPOptimizer(model.parameters(), 1e-3, scaler)
"""


def test_a_wrapper_handed_its_scaler_is_refused_naming_the_methods():
    source = (PROJECT / "amp_optimizer.py").read_text().replace("init_scale=2.0**7, scale_window=2):", "scaler):")
    source = re.sub(r"self._grad_scaler = torch.amp.GradScaler\(.*\)\n", "self._grad_scaler = scaler\n", source)
    source += HANDED_SCALER_USER
    assert "self._grad_scaler = scaler\n" in source
    result = migrate_source(source, "amp_optimizer.py")
    assert [d.code for d in result.diagnostics] == ["RPM106"]
    message = result.diagnostics[0].message
    assert "backward(), then clip_grad_norm() (unscales), step() (steps through self._grad_scaler)" in message
    assert "is handed its scaler from outside" in message
