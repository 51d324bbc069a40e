"""The diagnostics registry (migrate.codes) is the single source: every code the engine
emits is registered with its four parts and a unique kebab-case name, and the tables of
docs/migrate.md (generated) and its zh twin (translated) list exactly the registered codes."""

import pathlib
import re

from migrate.codes import REGISTRY, markdown_table

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
