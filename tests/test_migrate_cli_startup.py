"""What roundpipe-migrate loads (issue 14): ``--help`` and a run on files without AMP
never import the engine, libcst or its matchers; a real run loads nothing heavier than
libcst (never torch, numpy or roundpipe)."""

import json
import subprocess
import sys

from migrate_cli_support import REPO
from migrate_cli_support import SUBPROCESS_ENV as ENV

HEAVY = ("torch", "numpy", "roundpipe", "compat_matrix")


def modules_after(argv, tmp_path):
    """The top-level names in ``sys.modules`` after ``main(argv)``, and its exit status."""
    script = (
        "import json, sys\n"
        "from migrate import cli\n"
        f"code = cli.main({[str(arg) for arg in argv]!r})\n"
        "print(json.dumps([code, sorted(sys.modules)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    code, modules = json.loads(done.stdout.splitlines()[-1])
    return code, set(modules)


def test_help_imports_neither_the_engine_nor_libcst(tmp_path):
    code, modules = modules_after(["--help"], tmp_path)
    assert code == 0
    assert not {"migrate.engine", "libcst", "libcst.matchers"} & modules
    assert not {"concurrent.futures", "tempfile"} & modules


def test_a_run_on_files_without_amp_does_not_load_libcst(tmp_path):
    (tmp_path / "plain.py").write_text("import os\nprint(os.sep)\n")
    code, modules = modules_after(["-j", "2", "--check", tmp_path], tmp_path)
    assert code == 0
    assert not {"migrate.engine", "libcst"} & modules


def test_a_real_run_loads_nothing_heavier_than_libcst(tmp_path):
    (tmp_path / "train.py").write_text((REPO / "examples" / "amp_basic.py").read_text())
    code, modules = modules_after(["--check", tmp_path], tmp_path)
    assert code == 1
    assert {"migrate.engine", "libcst"} <= modules
    assert not {name.split(".")[0] for name in modules} & set(HEAVY)
