"""No file of a fixture project that uses a scaler is reported "unchanged" in silence while
another file of its program is refused (tests/migrate_projects; migrate.scaler_neighbours).

Runs the project analysis only (no program is run): fast, over every project."""

import pathlib

import pytest

from migrate.prefilter import might_use_a_scaler
from migrate.project import migrate_project

PROJECTS_ROOT = pathlib.Path(__file__).resolve().parent / "migrate_projects"
PROJECTS = sorted(p.name for p in PROJECTS_ROOT.iterdir() if (p / "main.py").is_file())
TARGET = "expected_exact"


def _sources(name: str) -> dict:
    folder = PROJECTS_ROOT / name
    return {
        str(p.relative_to(folder)): p.read_text()
        for p in sorted(folder.rglob("*.py"))
        if TARGET not in p.relative_to(folder).parts
    }


@pytest.mark.parametrize("name", PROJECTS)
def test_no_scaler_file_is_left_unchanged_without_a_diagnostic_beside_a_refusal(name):
    sources = _sources(name)
    results = migrate_project(sources, exact=True)
    if not any(not d.is_info for r in results.values() for d in r.diagnostics):
        return  # nothing refused: an unchanged file had nothing to do
    silent = [
        path
        for path, result in results.items()
        if might_use_a_scaler(sources[path]) and not result.changed and not result.diagnostics
    ]
    assert not silent, f"{name}: {silent} use a scaler, are unchanged and nothing names why"


def test_a_trainer_building_its_own_scaler_is_named_beside_a_refused_setup():
    """p15b's shape: trainer.py builds a GradScaler when handed None, main.py is refused for
    the scaler setup.py returns; trainer.py is named with main.py's refusal."""
    sources = {
        "setup.py": (
            "import torch\n\n\ndef build():\n    model = torch.nn.Linear(2, 2)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    return model, optimizer, torch.amp.GradScaler('cpu')\n"
        ),
        "trainer.py": (
            "import torch\n\n\nclass Trainer:\n    def __init__(self, model, optimizer, scaler=None):\n"
            "        self.model, self.optimizer = model, optimizer\n"
            "        self.scaler = scaler if scaler is not None else torch.amp.GradScaler('cpu')\n\n"
            "    def step(self, x):\n        loss = self.model(x).sum()\n"
            "        self.scaler.scale(loss).backward()\n        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n        self.optimizer.zero_grad()\n"
        ),
        "main.py": (
            "import torch\nfrom setup import build\nfrom trainer import Trainer\n\n"
            "model, optimizer, scaler = build()\ntrainer = Trainer(model, optimizer, scaler)\n"
            "trainer.step(torch.ones(1, 2))\n"
        ),
    }
    results = migrate_project(sources, exact=True)
    assert not any(r.changed for r in results.values())
    codes = [d.code for d in results["trainer.py"].diagnostics]
    assert codes == ["RPM110"] and "main.py" in results["trainer.py"].diagnostics[0].message
