"""The diagnostics registry (migrate.codes) is the single source: every code the engine
emits is registered with its four parts and a unique kebab-case name, and the tables of
docs/migrate.md (generated) and its zh twin (translated) list exactly the registered codes;
the fused-form reasons (UNFUSABLE) lead to the autograd form, not to a refusal."""

import pathlib
import re

import pytest

from migrate.codes import REGISTRY, markdown_table
from migrate.engine import migrate_source
from migrate.steps import UNFUSABLE

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_emitted_code_is_registered_and_documented():
    emitted = set()
    for path in (ROOT / "migrate").glob("*.py"):
        emitted |= set(re.findall(r'"(RPM\d{3})"', path.read_text()))
    assert emitted <= set(REGISTRY), emitted - set(REGISTRY)
    names = [entry.name for entry in REGISTRY.values()]
    assert len(set(names)) == len(names)
    for entry in REGISTRY.values():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", entry.name), entry.name
        assert entry.summary and entry.what and entry.action


def test_docs_diagnostics_tables_follow_the_registry():
    english = (ROOT / "docs" / "migrate.md").read_text()
    assert markdown_table() in english
    chinese = (ROOT / "docs" / "migrate.zh.md").read_text()
    section = chinese[chinese.index("## 诊断") :]
    assert re.findall(r"^\| (RPM\d{3}) \| `([a-z0-9-]+)`", section, re.M) == [
        (code, entry.name) for code, entry in REGISTRY.items()
    ]


_FUSABLE = (
    "import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    '    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n'
    "            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n"
    "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n"
    "        optimizer.zero_grad()\n"
)
# (code, what the mutation makes the step, its message): each keeps the forward out of a loss function
_UNFUSED = [
    ("RPM131", ('with torch.autocast("cuda"):', "with torch.no_grad():"), "not autocast"),
    ("RPM132", ("model(x)", "model(*[x])"), "*args"),
    ("RPM133", ("scaler.scale(loss).backward()", "scaler.scale(loss).backward(retain_graph=True)"), "retain_graph"),
]


@pytest.mark.parametrize("code,mutation,message", _UNFUSED, ids=[c for c, _, _ in _UNFUSED])
def test_a_fused_form_reason_gives_the_autograd_form_not_a_refusal(code, mutation, message):
    """The codes of :data:`migrate.steps.UNFUSABLE` are reasons for the autograd form: a
    torch.amp step that meets one still migrates, and the report names the reason."""
    assert code in UNFUSABLE and code in REGISTRY
    result = migrate_source(_FUSABLE.replace(*mutation), "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    notes = [r.description for r in result.rewrites if r.description.startswith("autograd form")]
    assert len(notes) == 1 and message in notes[0], notes
