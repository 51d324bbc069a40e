"""script_runs.run_python (a forked child of a Python that has imported torch) reports a
program run exactly as a fresh ``python script.py`` subprocess does."""

import subprocess
import sys
import textwrap

import pytest

import script_runs

HELPER = textwrap.dedent(
    """
    def fail(message):
        raise ValueError(message)
    """
)

PROGRAMS = {
    "argv_file_path_cwd_imports": """
        import os, sys
        import helper
        print(sys.argv, __name__, __file__, __package__, __spec__, __cached__)
        print(sys.path[0] == os.path.dirname(__file__), os.getcwd(), helper.__file__)
        print(open("data.txt").read())
        """,
    "exit_code": "import sys\nprint('before')\nsys.exit(3)\n",
    "exit_message": "import sys\nsys.exit('giving up')\n",
    "uncaught_exception": "import helper\n\ndef main():\n    helper.fail('no good')\n\nmain()\n",
    "chained_exception": "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e\n",
    "keyboard_interrupt": "raise KeyboardInterrupt\n",
    "shutdown_order": """
        import atexit, sys, threading, time
        atexit.register(lambda: print("atexit ran"))
        def late():
            time.sleep(0.2)
            print("thread joined before atexit")
        threading.Thread(target=late).start()
        print("main done", file=sys.stderr)
        """,
    "finalizer_at_shutdown": """
        import os, sys
        class Last:
            def __del__(self):
                print("finalizer ran", file=sys.stderr)
                sys.stderr.flush()
                os._exit(3)
        keep = Last()
        print("main done")
        """,
    "torch_after_fork": """
        import torch
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 64)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        for _ in range(3):
            loss = layer(torch.randn(256, 64)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"{loss.item():.8f}", torch.get_num_threads())
        """,
}


@pytest.fixture()
def project(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "helper.py").write_text(HELPER)
    (tmp_path / "data.txt").write_text("read from the working folder\n")
    return tmp_path


def _both(project, name, *args):
    script = project / "src" / f"{name}.py"
    script.write_text(textwrap.dedent(PROGRAMS[name]))
    argv = ["src/" + script.name, *args]
    plain = subprocess.run([sys.executable, *argv], cwd=project, capture_output=True, text=True, timeout=120)
    return script_runs.run_python(argv, cwd=project, timeout=120), plain


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_forked_run_reports_what_a_fresh_interpreter_reports(project, name):
    forked, plain = _both(project, name, "--flag", "value")
    assert (forked.returncode, forked.stdout, forked.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert forked.args == plain.args


def test_the_runs_are_forked_from_a_process_that_has_imported_torch(project):
    """The one visible difference, and the proof that the comparisons above compared the
    forked path (not a fallback to a subprocess)."""
    (project / "src" / "probe.py").write_text("import sys\nprint('torch' in sys.modules)\n")
    assert script_runs.run_python(["src/probe.py"], cwd=project).stdout == "True\n"
    assert subprocess.run([sys.executable, "src/probe.py"], cwd=project, capture_output=True, text=True).stdout == (
        "False\n"
    )


def test_a_run_past_its_timeout_is_killed_and_the_runner_goes_on(project):
    (project / "src" / "hang.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        script_runs.run_python(["src/hang.py"], cwd=project, timeout=1)
    assert expired.value.stdout == "started\n"
    forked, plain = _both(project, "exit_code")
    assert (forked.returncode, forked.stdout) == (plain.returncode, plain.stdout) == (3, "before\n")


def test_a_changed_environment_takes_a_fresh_interpreter(project, monkeypatch):
    (project / "src" / "probe.py").write_text("import os, sys\nprint('torch' in sys.modules, os.environ['X'])\n")
    monkeypatch.setenv("X", "set by the test")
    assert script_runs.run_python(["src/probe.py"], cwd=project).stdout == "False set by the test\n"


def test_each_forked_run_draws_its_own_torch_random_numbers(project):
    script = project / "draw.py"
    script.write_text("import torch\nprint(torch.initial_seed(), torch.rand(1).item())\n")
    first, second = (script_runs.run_python([script.name], cwd=project, timeout=120) for _ in range(2))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout != second.stdout, "forked children share one torch random state"
