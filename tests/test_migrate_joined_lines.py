"""Line numbers inside the diagnostics of files analysed as one joined module.

A trainer's base classes in another file are joined ahead of it (migrate/joined_classes.py);
a diagnostic's own position goes back to its file, and so must every ``line N`` its message
names (before, they were the joined module's lines: a few lines off, pointing at nothing).
"""

from __future__ import annotations

import pathlib

from migrate.project import migrate_project

PROJECT = pathlib.Path(__file__).resolve().parent / "migrate_projects" / "mmengine_optim_wrapper"


def test_lines_named_in_a_joined_diagnostic_are_lines_of_its_own_file():
    sources = {name: (PROJECT / name).read_text() for name in ("optim_wrapper.py", "main.py")}
    # the scaler built in either branch is followed; a third binding, outside them, is not
    sources["optim_wrapper.py"] += "\n    def close(self):\n        self.loss_scaler = None\n"
    results = migrate_project(sources, exact=True)
    wrapper = sources["optim_wrapper.py"].splitlines()
    bound = [number for number, text in enumerate(wrapper, 1) if "self.loss_scaler = " in text]
    assert len(bound) == 3
    [message] = [d.message for d in results["optim_wrapper.py"].diagnostics if d.code == "RPM120"]
    assert f"(lines {bound[0]}, {bound[1]}, {bound[2]})" in message
