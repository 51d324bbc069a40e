"""Main-thread uses of the wrapped model after the RoundPipe wrap that the migration cannot
keep: weights written in place after the optimizer is built (RPM141, migrate/weight_writes.py),
gradients read by the caller of a function holding the step
(RPM140, migrate/gradient_reads.py) and the wrapper pickled inside a container (RPM125).

Each shape migrated before with other numbers (or crashed); now the file is left unchanged
with the diagnostic at the blocking statement. The near-misses still migrate and, with
``--exact``, print the original's numbers.
"""

import contextlib
import io
import pathlib
import runpy

import pytest

from migrate import cli
from migrate.engine import migrate_source
from trainer_text import TRAINER_CLASS

PROGRAM = """
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 64)
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def main():
    torch.manual_seed(0)
    model = Net()
    #BEFORE#
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    #AFTER#
    torch.manual_seed(1)
    for step in range(4):
        x = torch.randn(8, 16)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
"""


def _program(after: str = "", before: str = "") -> str:
    def indented(lines: str) -> str:
        return "\n".join("    " + line for line in lines.splitlines())

    return PROGRAM.replace("    #BEFORE#", indented(before)).replace("    #AFTER#", indented(after))


def _refused(source: str, code: str, first_line_text: str) -> None:
    result = migrate_source(source, "train.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == [code], [d.format() for d in result.diagnostics]
    line = source.splitlines()[result.diagnostics[0].line - 1]
    assert first_line_text in line, result.diagnostics[0].format()


def _run(source: str, tmp_path, name: str) -> str:
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    return out.getvalue()


WEIGHT_WRITES = {
    "init-of-an-attribute": ("nn.init.zeros_(model.head.bias)", "nn.init.zeros_"),
    "in-place-method-under-no-grad": ("with torch.no_grad():\n    model.head.bias.zero_()", "zero_()"),
    "init-of-each-parameter": ("for p in model.parameters():\n    nn.init.normal_(p, std=0.05)", "for p in"),
    "data-assigned": ("model.head.weight.data = model.head.weight.data * 0.5", ".data ="),
    "init-of-named-parameters": (
        'for name, p in model.named_parameters():\n    if "bias" in name:\n        torch.nn.init.constant_(p, 0.1)',
        "for name, p in",
    ),
    "parameter-scaled-in-place": ("for p in model.parameters():\n    p.data.mul_(0.5)", "for p in"),
    "augmented-assignment": ("with torch.no_grad():\n    for p in model.parameters():\n        p *= 0.5", "for p in"),
    "apply": ("model.apply(lambda m: None)", "model.apply"),
    "modules-loop": (
        "for m in model.modules():\n    if isinstance(m, nn.Linear):\n        m.bias.data.fill_(0.0)",
        "for m in",
    ),
    "reset-parameters": ("model.head.reset_parameters()", "reset_parameters"),
    # a cast of the floating-point type: the optimizer's copies keep theirs
    "cast-half": ("model.half()", "model.half()"),
    "cast-submodule-double": ("model.head.double()", "model.head.double()"),
    "cast-to-dtype": ("model.to(torch.float64)", "model.to(torch.float64)"),
    "cast-to-device-and-dtype": ('model.to("cpu", torch.bfloat16)', "torch.bfloat16"),
    "cast-to-dtype-keyword": ("model.to(dtype=torch.float16)", "dtype=torch.float16"),
    # a module's cast returns the module: a module method on the result keeps it a module cast
    "cast-submodule-then-eval": ("model.head.double().eval()", "model.head.double()"),
    "cast-submodule-bound": ("head = model.head.half()", "model.head.half()"),
    # reached through a call, a builtin, a name or a comprehension (each migrated before with
    # other numbers: the write missed the optimizer's copies)
    "through-get-submodule": ('model.get_submodule("head").weight.data.mul_(0.5)', "get_submodule"),
    "through-get-parameter": ('model.head.get_parameter("weight").data.fill_(0)', "get_parameter"),
    "init-through-get-submodule": ('nn.init.zeros_(model.get_submodule("head").weight)', "nn.init.zeros_"),
    "next-parameter": ("next(model.parameters()).data.mul_(0.5)", "next(model.parameters())"),
    "listed-parameter": ("list(model.parameters())[0].data.mul_(0.5)", "list(model.parameters())[0]"),
    "named-alias": ("w = model.head.weight\nw.data.mul_(0.5)", "w.data.mul_"),
    "module-alias": ('head = model.get_submodule("head")\nhead.reset_parameters()', "head.reset_parameters"),
    "listed-alias": ("params = list(model.parameters())\nparams[0].data.zero_()", "params[0]"),
    "state-dict-tensor": ('model.state_dict()["head.bias"].zero_()', "state_dict()"),
    "clipped-in-a-comprehension": ("[p.data.clamp_(-0.1, 0.1) for p in model.parameters()]", "clamp_"),
    "clipped-filtered": (
        "for p in filter(lambda q: q.dim() > 1, model.parameters()):\n    p.data.clamp_(-1, 1)",
        "for p in",
    ),
    "clipped-enumerated": ("for i, p in enumerate(model.parameters()):\n    p.data.clamp_(-1, 1)", "for i, p in"),
    "copied-under-no-grad": (
        "with torch.no_grad():\n    for p in model.parameters():\n        p.copy_(p.clamp(-1, 1))",
        "for p in",
    ),
    "vector-to-parameters": (
        "nn.utils.vector_to_parameters(nn.utils.parameters_to_vector(model.parameters()) * 0.5, model.parameters())",
        "vector_to_parameters",
    ),
    "foreach-in-place": ("torch._foreach_mul_(list(model.parameters()), 0.5)", "_foreach_mul_"),
    "reparametrized": (
        'nn.utils.parametrize.register_parametrization(model.head, "weight", nn.Identity())',
        "register_",
    ),
}


@pytest.mark.parametrize("shape", sorted(WEIGHT_WRITES))
def test_weights_written_after_the_optimizer_are_refused(shape):
    write, text = WEIGHT_WRITES[shape]
    _refused(_program(after=write), "RPM141", text)


def test_weights_written_through_an_index_of_the_wrapped_model_are_refused():
    """``model[2]`` itself goes to the wrapped module (tests/test_migrate_wrapped_containers.py);
    a write through it is still a write of the weights after the optimizer."""
    source = _program().replace(
        "    model = Net()\n", "    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))\n"
    )
    _refused(
        source.replace("    torch.manual_seed(1)\n", "    nn.init.zeros_(model[2].bias)\n    torch.manual_seed(1)\n"),
        "RPM141",
        "model[2]",
    )


@pytest.mark.parametrize(
    "before",
    [
        "nn.init.zeros_(model.head.bias)",
        "for p in model.parameters():\n    nn.init.normal_(p, std=0.05)",
        "with torch.no_grad():\n    model.head.weight.data = model.head.weight.data * 0.5",
    ],
)
def test_weights_written_before_the_optimizer_migrate_with_the_same_numbers(before, tmp_path):
    source = _program(before=before)
    result = migrate_source(source, "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    original = _run(source, tmp_path, "original")
    assert original.count("step ") == 4
    assert _run(result.migrated, tmp_path, "migrated") == original


WEIGHT_READS = {
    "ema-from-the-weights": (
        "shadow = Net()\nwith torch.no_grad():\n    for e, p in zip(shadow.parameters(), model.parameters()):\n"
        "        e.mul_(0.5).add_(p, alpha=0.5)"
    ),
    "counted": "n = sum(p.numel() for p in model.parameters())",
    "cloned-then-written": "w = model.head.weight.clone()\nw.zero_()",
    "device-of-the-first": "dev = next(model.parameters()).device",
    "flattened-copy-written": "vec = nn.utils.parameters_to_vector(model.parameters())\nvec.mul_(2)",
    "enumerated-shapes": "for i, p in enumerate(model.parameters()):\n    shape = (i, p.shape)",
    "norm-written": "norm = model.head.weight.norm()\nnorm.mul_(2)",
    "cast-of-a-parameter": "weight = next(model.parameters()).float().sum().item()",
    # a parameter reached by attribute, its cast used as a tensor: a module's cast returns the
    # module, which has no ``sum``, no ``tolist`` and no arithmetic
    "cast-of-an-attribute-summed": "weight = model.head.weight.double().sum().item()",
    "cast-of-an-attribute-listed": "weight = model.head.bias.half().tolist()",
    "cast-of-an-attribute-scaled": "weight = model.head.weight.float() * 2",
    "to-dtype-of-an-attribute-summed": "weight = model.head.weight.to(torch.float64).sum()",
    "type-of-an-attribute-normed": "weight = model.head.weight.type(torch.float64).norm()",
    "state-dict-cloned": "frozen = {k: v.clone() for k, v in model.state_dict().items()}",
    "frozen-by-attribute": "for p in model.body.parameters():\n    p.requires_grad = False",
    "gradients-dropped": "for p in model.parameters():\n    p.grad = None",
    "training-flag-set": "model.training = True",
}


@pytest.mark.parametrize("shape", sorted(WEIGHT_READS))
def test_weights_read_after_the_optimizer_migrate_with_the_same_numbers(shape, tmp_path):
    """Reads of the weights (or writes of a copy of them) that look like the writes above."""
    source = _program(after=WEIGHT_READS[shape])
    result = migrate_source(source, "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    original = _run(source, tmp_path, "original")
    assert original.count("step ") == 4
    assert _run(result.migrated, tmp_path, "migrated") == original


def test_a_device_move_after_the_optimizer_is_not_a_weight_write(tmp_path):
    source = _program(after='model.to("cpu")')
    result = migrate_source(source, "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert _run(result.migrated, tmp_path, "migrated") == _run(source, tmp_path, "original")


def test_a_parameter_cast_read_after_training_synchronizes_first(tmp_path):
    """``model.head.weight.double().sum()`` after the loop reads a parameter (a tensor's cast
    makes a new tensor); in the default form it waits for the last step first."""
    loop_print = '        print(f"step {step} loss {loss.item():.6f}")\n'
    read = '    print("w", repr(model.head.weight.double().sum().item()))\n'
    source = _program().replace(loop_print, loop_print + read)
    result = migrate_source(source, "train.py", exact=False)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert "    model.synchronize()\n" + read in result.migrated
    migrated = _run(result.migrated, tmp_path, "migrated")  # the default form: steps overlap, numbers differ
    assert migrated.count("step ") == 4 and migrated.count("\nw ") == 1
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert _run(exact.migrated, tmp_path, "exact") == _run(source, tmp_path, "original")


def test_freezing_a_parameter_after_the_optimizer_is_not_a_weight_write():
    result = migrate_source(_program(after="model.body.weight.requires_grad_(False)"), "train.py", exact=True)
    assert "RPM141" not in [d.code for d in result.diagnostics], [d.format() for d in result.diagnostics]


@pytest.mark.parametrize(
    "save",
    [
        'torch.save([model, optimizer], "/dev/null")',
        'torch.save((model, step), "/dev/null")',
        'torch.save({model}, "/dev/null")',
    ],
)
def test_the_wrapped_model_held_in_a_literal_is_refused(save):
    source = _program().replace("        print(f", f"        {save}\n        print(f")
    _refused(source, "RPM125", save)


@pytest.mark.parametrize(
    "save, saved",
    [
        ('torch.save(obj=model, f="/dev/null")', 'torch.save(obj=model.model, f="/dev/null")'),
        ("blob = pickle.dumps(model)", "blob = pickle.dumps(model.model)"),
    ],
)
def test_the_whole_model_pickled_gets_the_wrapped_module(save, saved):
    source = "import pickle\n" + _program().replace("        print(f", f"        {save}\n        print(f")
    result = migrate_source(source, "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert f"        model.synchronize()\n        {saved}\n" in result.migrated


CALLER = """
import torch
import torch.nn as nn


def train_step(model, optimizer, scaler, x, y):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    #BEFORE#
    for step in range(4):
        x = torch.randn(8, 16)
        #TOP#
        loss = train_step(model, optimizer, scaler, x, x.sum(dim=1, keepdim=True))
        #AFTER#
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
"""

GRAD_NORM = "gn = sum(p.grad.norm().item() for p in model.parameters() if p.grad is not None)"


def _caller(where: str) -> str:
    source = CALLER
    for mark in ("#BEFORE#", "#TOP#", "#AFTER#"):
        source = source.replace(mark, GRAD_NORM if mark == where else "pass")
    return source


@pytest.mark.parametrize("where", ["#AFTER#", "#TOP#"])
def test_gradients_read_by_the_caller_of_the_step_are_refused(where):
    _refused(_caller(where), "RPM140", "p.grad.norm()")


TRAINER = (
    TRAINER_CLASS
    + """    def fit(self):
        for step in range(4):
            x = torch.randn(8, 16)
            loss = self.train_step(x, x.sum(dim=1, keepdim=True))
            gn = sum(p.grad.norm().item() for p in self.model.parameters())
            print(f"step {step} loss {loss.item():.6f} gn {gn:.6f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    Trainer().fit()
"""
)


def test_gradients_read_by_the_caller_of_a_steps_method_are_refused():
    _refused(TRAINER, "RPM140", "p.grad.norm()")


def test_gradients_read_by_the_caller_before_any_step_migrate():
    result = migrate_source(_caller("#BEFORE#"), "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]


def test_gradients_read_after_an_optimizer_wrappers_step_are_refused(tmp_path):
    wrapper_project = pathlib.Path(__file__).resolve().parent / "migrate_projects" / "optimizer_wrapper_class"
    project = tmp_path / "project"
    project.mkdir()
    (project / "amp_optimizer.py").write_text((wrapper_project / "amp_optimizer.py").read_text())
    main = (wrapper_project / "main.py").read_text()
    assert "    optimizer.step()\n" in main
    main = main.replace("    optimizer.step()\n", f"    optimizer.step()\n    {GRAD_NORM}\n")
    (project / "main.py").write_text(main)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = cli.main(["--exact", "-o", str(tmp_path / "out"), str(project)])
    assert status == 1 and not list((tmp_path / "out").rglob("*.py"))
    assert "RPM140 `gn = sum(p.grad.norm().item()" in err.getvalue(), err.getvalue()


GRAD_HELPER = """

def grad_total(model):
    return sum(p.grad.norm().item() for p in model.parameters() if p.grad is not None)


def logged(model):
    return grad_total(model)


def weight_total(model):
    return sum(p.norm().item() for p in model.parameters())
"""


def _with_helpers(source: str) -> str:
    return source.replace("\n\ndef main():", GRAD_HELPER + "\n\ndef main():")


@pytest.mark.parametrize("helper", ["grad_total", "logged"])
def test_a_helper_reading_gradients_after_the_step_is_refused(helper):
    """The helper's read migrated before and printed other numbers under --exact."""
    source = _with_helpers(PROGRAM).replace("        print(f", f"        gn = {helper}(model)\n        print(f")
    _refused(source, "RPM140", f"{helper}(model)")


def test_a_helper_reading_gradients_after_a_step_function_is_refused():
    source = _with_helpers(CALLER).replace("#AFTER#", "gn = logged(model)").replace("#BEFORE#", "pass")
    _refused(source.replace("#TOP#", "pass"), "RPM140", "logged(model)")


def test_a_method_reading_gradients_after_the_step_is_refused():
    source = TRAINER.replace(
        "            gn = sum(p.grad.norm().item() for p in self.model.parameters())\n",
        "            gn = self.grad_total()\n",
    ).replace(
        "    def fit(self):",
        "    def grad_total(self):\n        return sum(p.grad.norm().item() for p in self.model.parameters())\n\n"
        "    def fit(self):",
    )
    _refused(source, "RPM140", "self.grad_total()")


@pytest.mark.parametrize(
    "where, call",
    [
        ("        scaler.step(optimizer)", "gn = grad_total(model)"),  # between the backward and the step
        ("        print(f", "wn = weight_total(model)"),  # weights, not gradients
    ],
)
def test_helpers_reading_what_the_step_leaves_alone_migrate_with_the_same_numbers(where, call, tmp_path):
    source = _with_helpers(PROGRAM).replace(where, f"        {call}\n{where}", 1)
    shown = call.partition(" =")[0]
    source = source.replace('{loss.item():.6f}")', f'{{loss.item():.6f}} {{{shown}:.6f}}")')
    result = migrate_source(source, "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    original = _run(source, tmp_path, "original")
    assert original.count("step ") == 4
    assert _run(result.migrated, tmp_path, "migrated") == original
