"""Optimizer wrapper classes that own the scaler (issue 10, shapes 2 and 3; fairseq style):
the project is left byte-identical, and the refusal names the methods the training loop
calls in turn, in the class's file and in the file that uses it."""

import contextlib
import io
import pathlib

from migrate import cli
from migrate.engine import migrate_source

PROJECT = pathlib.Path(__file__).resolve().parent / "migrate_projects" / "optimizer_wrapper_class"


def test_the_wrapper_project_is_refused_naming_the_methods(tmp_path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["--exact", "--exclude", "expected_exact", "-o", str(tmp_path), str(PROJECT)])
    assert code == 1 and not list(tmp_path.rglob("*.py"))
    lines = err.getvalue().splitlines()
    in_class = next(line for line in lines if "amp_optimizer.py:16:" in line)
    assert " RPM106 " in in_class and "AMPOptimizer is an optimizer wrapper" in in_class
    assert "backward(), then clip_grad_norm() (unscales), step() (steps through self._grad_scaler)" in in_class
    assert any("main.py:13:" in line and " RPM111 " in line for line in lines)


def test_a_trainer_class_without_an_optimizers_interface_is_a_split_step_not_a_wrapper():
    """Without ``zero_grad`` the class is a trainer whose step is split over methods: that
    shape is followed (migrate/split_step.py), and what blocks it here is its optimizer,
    built on a list of parameters rather than on one model's."""
    source = (PROJECT / "amp_optimizer.py").read_text().replace("def zero_grad(self):", "def clear(self):")
    result = migrate_source(source, "amp_optimizer.py")
    assert [d.code for d in result.diagnostics] == ["RPM108"]
    assert "optimizer wrapper" not in result.diagnostics[0].message
    assert "not built on `model.parameters()`" in result.diagnostics[0].message
