"""Which files reach the engine (issue 9): the prefilter's markers, files that candidates
import, syntax errors everywhere; and how ``-j`` shares the work (issue 14)."""

import time

import pytest

from fake_engine import noting_migrate, waiting_migrate
from migrate import cli, pool
from migrate.prefilter import imported_modules, might_use_a_scaler, might_use_amp, select_candidates
from migrate_cli_support import run


def seen(err):
    """The paths the noting engine saw, in output order."""
    return [line.split(":1:1:")[0] for line in err.splitlines() if "seen by the engine" in line]


@pytest.mark.parametrize(
    "text",
    [
        "scaler = GradScaler()",
        "self.loss_scaler.scale(loss).backward()",
        "trainer.scaler.unscale_(optimizer)",
        "with amp.scale_loss(loss, optimizer) as scaled:",
        "from torch.cuda import amp",
        "import apex.amp as amp",
        "from torch.amp import autocast",
        "    from apex import amp  # inside a function",
    ],
)
def test_prefilter_sees_scaler_calls_and_amp_imports(text):
    assert might_use_amp("import torch\n" + text + "\n")


@pytest.mark.parametrize("text", ["import torch\nx = torch.ones(2)\n", "amplitude = 3\nexample = 'amp'\n"])
def test_prefilter_passes_over_files_without_a_marker(text):
    assert not might_use_amp(text)


@pytest.mark.parametrize(
    "text, marked",
    [
        ("from timm.utils import NativeScaler", True),
        ("model, optimizer = amp.initialize(model, optimizer)", True),
        ("optimizer = FP16_Optimizer(optimizer)", True),
        ("amp_handle = amp.init()", True),
        ("# trained with apex", True),
        ("apexes = 3", False),
        ("MyNativeScalerX = 1", False),
        ("import sampler  # amp_ in no word", False),
    ],
)
def test_prefilter_words_are_whole_words(text, marked):
    assert might_use_amp(text + "\n") is marked


@pytest.mark.parametrize(
    "text, marked",
    [("self.loss_scaler(loss, optimizer)", True), ("loss_scalers = []", False), ("x.scale(2)", True)],
)
def test_scaler_uses_mark_a_file_for_the_engine(text, marked):
    assert might_use_a_scaler(text + "\n") is marked


def test_import_scan_finds_absolute_relative_and_parenthesised_imports():
    text = (
        "import os.path, models.resnet as rn\n"
        "from . import helpers\n"
        "from ..common.build import (\n    make_model,\n    make_optimizer,\n)\n"
        "if x:\n    from data import loader  # comment\n"
    )
    assert set(imported_modules(text)) == {
        (0, "os.path"),
        (0, "models.resnet"),
        (1, "helpers"),
        (2, "common.build"),
        (2, "common.build.make_model"),
        (2, "common.build.make_optimizer"),
        (0, "data"),
        (0, "data.loader"),
    }


def test_files_that_candidates_import_are_selected_transitively(tmp_path):
    files = {
        "proj/train.py": "from torch.amp import GradScaler\nfrom proj.models import build\n",
        "proj/models/__init__.py": "from .build import build\n",
        "proj/models/build.py": "import torch\n",
        "proj/unrelated.py": "import proj.models\n",
        "other/build.py": "x = 1\n",
    }
    paths = [str(tmp_path / rel) for rel in files]
    assert select_candidates(paths, list(files.values())) == [True, True, True, False, False]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_engine_sees_candidates_and_the_files_they_import_only(tmp_path, capsys, monkeypatch, jobs):
    monkeypatch.setattr(cli, "ENGINE", noting_migrate)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(
        "from torch.amp import GradScaler\nfrom .model import Net\nimport pkg.optim\n"
    )
    (tmp_path / "pkg" / "model.py").write_text("import torch\nclass Net: pass\n")
    (tmp_path / "pkg" / "optim.py").write_text("import torch\n")
    for i in range(6):
        (tmp_path / "pkg" / f"util{i}.py").write_text("import os\n")
    (tmp_path / "pkg" / "scale.py").write_text("def f(s, loss):\n    return s.scale(loss)\n")
    code, _, err = run(capsys, "-j", jobs, tmp_path)
    assert code == 0
    assert seen(err) == [str(tmp_path / "pkg" / name) for name in ("model.py", "optim.py", "scale.py", "train.py")]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_syntax_error_is_found_in_a_file_the_engine_never_sees(tmp_path, capsys, monkeypatch, jobs):
    monkeypatch.setattr(cli, "ENGINE", noting_migrate)
    (tmp_path / "a.py").write_text("scaler = GradScaler()\n")
    (tmp_path / "b.py").write_text("scaler = GradScaler()\n")
    (tmp_path / "c.py").write_text("print 'old'\n")
    code, _, err = run(capsys, "-j", jobs, tmp_path)
    assert code == 2
    assert f"{tmp_path / 'c.py'}:1:1: RPM901 syntax error, file skipped: Missing parentheses" in err
    assert seen(err) == [str(tmp_path / "a.py"), str(tmp_path / "b.py")]


def test_a_worker_sends_back_no_text_for_an_unchanged_file():
    task = cli.Task("a.py", "x = 1\n", look=True)
    assert cli.process(task, noting_migrate, exact=False).migrated is None
    task = cli.Task("b.py", "s = GradScaler()\n", look=True)
    assert cli.process(task, noting_migrate, exact=False).migrated == "s = GradScaler()\n# migrated\n"


def test_costly_tasks_go_first_in_pairs_and_cheap_ones_in_large_chunks():
    costly = [i % 10 == 0 for i in range(200)]
    order = sorted(range(200), key=lambda index: not costly[index])
    chunks = pool._chunks(order, costly)
    assert chunks[:10] == [
        [0, 10],
        [20, 30],
        [40, 50],
        [60, 70],
        [80, 90],
        [100, 110],
        [120, 130],
        [140, 150],
        [160, 170],
        [180, 190],
    ]
    assert [len(chunk) for chunk in chunks[10:]] == [64, 64, 52]


def test_two_workers_share_the_costly_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "ENGINE", waiting_migrate)
    for i in range(10):
        (tmp_path / f"train{i}.py").write_text("scaler = GradScaler()\n")
    for i in range(100):
        (tmp_path / f"plain{i:03d}.py").write_text("x = 1\n")
    walls = {}
    for jobs in ("1", "2"):
        start = time.monotonic()
        assert run(capsys, "--check", "-q", "-j", jobs, tmp_path)[0] == 1
        walls[jobs] = time.monotonic() - start
    assert walls["2"] < 0.75 * walls["1"], walls
