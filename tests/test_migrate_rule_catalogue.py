"""Every rule of migrate/rules/ runs its own examples (rewrites with the fragments they
promise, refusals with their codes, no-op near-misses that get past the prefilter), and the
pattern tables of docs/migrate.md and its zh twin are generated from the same data."""

import pathlib

import pytest

from migrate.engine import migrate_source
from migrate.prefilter import might_use_amp
from migrate.rules import all_rules, pattern_table

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = [(rule.name, i, example) for rule in all_rules() for i, example in enumerate(rule.examples)]


@pytest.mark.parametrize("name,index,example", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_rule_example(name, index, example):
    result = migrate_source(example.before, f"{name}.py", apex_target=example.apex_target)
    if example.codes:
        assert [d.code for d in result.diagnostics] == list(example.codes)
        assert result.migrated == example.before
    elif example.expect:
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        for fragment in example.expect:
            assert fragment in result.migrated
        compile(result.migrated, name, "exec")
        again = migrate_source(result.migrated, name, apex_target=example.apex_target)
        assert again.migrated == result.migrated and again.diagnostics == []  # idempotent, and silent
    else:
        assert might_use_amp(example.before)  # a near-miss the prefilter lets through
        assert result.migrated == example.before and result.diagnostics == []


def test_every_rule_declares_rewrites_and_a_no_op():
    for rule in all_rules():
        assert rule.description and rule.patterns and rule.implemented_in
        assert any(e.expect for e in rule.examples), rule.name
        assert any(not e.expect and not e.codes for e in rule.examples), rule.name
        for module in rule.implemented_in:
            assert (ROOT / "migrate" / module).exists()


def test_docs_pattern_tables_are_generated_from_the_rules():
    assert pattern_table() in (ROOT / "docs" / "migrate.md").read_text()
    assert pattern_table(chinese=True) in (ROOT / "docs" / "migrate.zh.md").read_text()
