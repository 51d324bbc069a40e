"""The catalogue of roundpipe-migrate's rewrite rules, one module per rule.

Each module of this package declares ``RULE``: the diagnostic codes it may raise, a one-line
description, the rows it contributes to the pattern table of ``docs/migrate.md`` (English
and Chinese), and its examples as data, in the manner of Fixit: code that is rewritten
(with fragments the output must contain), near-misses that contain an AMP marker and must
stay unchanged, and code that is refused with its diagnostic codes. :func:`all_rules`
collects the modules automatically; one test runs every example, and the pattern tables are
generated from the same data (:func:`pattern_table`), so rule, documentation and tests sit
in one place. The rewriting itself is done by the engine modules the rule names
(``implemented_in``).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import List, Tuple

__all__ = ["Example", "Pattern", "Rule", "all_rules", "pattern_table"]


@dataclass(frozen=True)
class Example:
    """``before`` is rewritten into text containing every ``expect`` fragment; with
    ``codes`` it is refused (left unchanged) with exactly those diagnostics; with neither,
    it is a no-op near-miss that must come back unchanged and silent. ``apex_target`` is the
    ``--apex-target`` it is migrated with."""

    before: str
    expect: Tuple[str, ...] = ()
    codes: Tuple[str, ...] = ()
    apex_target: str = "compat"  # the --apex-target the example runs with


@dataclass(frozen=True)
class Pattern:
    """One row of the pattern table, in English and Chinese."""

    pattern: str
    becomes: str
    pattern_zh: str
    becomes_zh: str


@dataclass(frozen=True)
class Rule:
    """One rewrite rule: what it rewrites, where, and its examples."""

    name: str
    order: int  # position in the pattern table
    description: str
    codes: Tuple[str, ...]
    implemented_in: Tuple[str, ...]
    patterns: Tuple[Pattern, ...]
    examples: Tuple[Example, ...] = field(default=())


def all_rules() -> List[Rule]:
    """Every ``RULE`` of this package's modules, in table order."""
    rules = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        rules.append(module.RULE)
    return sorted(rules, key=lambda rule: rule.order)


def pattern_table(chinese: bool = False) -> str:
    """The pattern table of docs/migrate.md (``chinese``: of docs/migrate.zh.md)."""
    head = "| 模式 | 改写为 |\n|---|---|\n" if chinese else "| pattern | becomes |\n|---|---|\n"
    rows = [
        (p.pattern_zh, p.becomes_zh) if chinese else (p.pattern, p.becomes)
        for rule in all_rules()
        for p in rule.patterns
    ]
    return head + "".join(f"| {pattern} | {becomes} |\n" for pattern, becomes in rows)
