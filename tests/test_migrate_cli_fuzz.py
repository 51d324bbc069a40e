"""The mutation test at the command line's boundary (issue 11): fixture and example
scripts, mutated a few lines at a time and then made hostile (deep nesting, NUL bytes, a BOM, CRLF
line endings), go through the same path as a file: decode, check, migrate, restore.

Whatever the input, nothing escapes as an exception; what comes out either is the input
unchanged with a diagnostic or compiles, keeps the BOM and the line endings, and is a
fixed point.
"""

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate import cli
from migrate.files import BOM, Source, decode

ROOT = Path(__file__).resolve().parents[1]
INPUTS = sorted((ROOT / "tests" / "migrate_cases").glob("*.py")) + sorted((ROOT / "examples").glob("*amp_*.py"))
BARE_LF = re.compile(r"(?<!\r)\n")


def _deep(kind, depth):
    """One statement nested ``depth`` deep."""
    if kind == "brackets":
        return "x = " + "(" * depth + "1" + ")" * depth
    if kind == "lists":
        return "x = " + "[" * depth + "]" * depth
    if kind == "unary":
        return "x = " + "-" * depth + "1"
    return "x = " + "a and " * depth + "1"


WINDOW_OPS = st.tuples(
    st.sampled_from(["cut", "repeat", "reverse", "dedent"]),
    st.integers(0, 10_000),
    st.integers(1, 3),
)
HOSTILE = st.one_of(
    st.tuples(
        st.just("deep"),
        st.sampled_from(["brackets", "lists", "unary", "and"]),
        st.sampled_from([50, 199, 200, 201, 500, 2000, 5000]),
        st.integers(0, 10_000),
    ),
    st.tuples(st.just("nul"), st.integers(0, 100_000)),
    st.tuples(st.just("bom")),
    st.tuples(st.just("crlf")),
)


def _compiles(text):
    """Python's own parser accepts ``text`` (null bytes and nesting past its limit it refuses)."""
    try:
        compile(text, "mutant.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _mutate(lines, ops):
    """``lines`` after each window operation ``(op, start, size)`` on ``size`` lines."""
    for op, start, size in ops:
        start %= max(1, len(lines))
        window, end = lines[start : start + size], start + size
        if op == "cut":
            window = []
        elif op == "repeat":
            window = window * 2
        elif op == "reverse":
            window = window[::-1]
        else:
            window = [line[4:] if line.startswith("    ") else line for line in window]
        lines = lines[:start] + window + lines[end:]
    return lines


def _make_hostile(lines, changes):
    """The bytes of ``lines`` after each hostile change."""
    text, bom, crlf = "".join(lines), False, False
    for change in changes:
        if change[0] == "deep":
            _, kind, depth, at = change
            split = text.splitlines(True)
            split.insert(at % (len(split) + 1), _deep(kind, depth) + "\n")
            text = "".join(split)
        elif change[0] == "nul":
            at = change[1] % (len(text) + 1)
            text = text[:at] + "\x00" + text[at:]
        elif change[0] == "bom":
            bom = True
        else:
            crlf = True
    if crlf:
        text = text.replace("\n", "\r\n")
    return (BOM if bom else "").encode() + text.encode("utf-8")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(INPUTS),
    st.lists(WINDOW_OPS, max_size=3),
    st.lists(HOSTILE, min_size=1, max_size=3),
)
def test_hostile_mutants_never_escape_and_never_lose_what_the_file_had(path, ops, changes):
    data = _make_hostile(_mutate(path.read_text().splitlines(True), ops), changes)
    source = decode(data)
    assert isinstance(source, Source)
    result = cli.migrate_text(source.text, "mutant.py", cli.real_engine, False, look=True)
    stored = source.restore(result.migrated)
    if not result.changed:
        assert stored.encode("utf-8") == data
        hostile = "\x00" in source.text or "(" * 201 in source.text  # a deep line may land in a docstring
        if hostile and not _compiles(source.text):
            assert [d.code for d in result.diagnostics] == ["RPM901"]
        return
    compile(result.migrated, "mutant.py", "exec")
    assert stored.startswith(BOM) == data.startswith(BOM.encode())
    if "\r\n" in source.text and not BARE_LF.search(source.text):
        assert not BARE_LF.search(result.migrated)
    again = cli.migrate_text(result.migrated, "mutant.py", cli.real_engine, False, look=True)
    assert again.migrated == result.migrated
