"""Migrated code is not worse to a linter than the code it came from (issue 13).

Every input the migration rewrites is taken: the examples, the rule modules' embedded
examples, the fixture files of tests/migrate_cases/ and the fixture projects of
tests/migrate_cases/projects/ and tests/migrate_projects/ (without their hand-written
targets). Each is first formatted with ``ruff format``, so that what the user's file already
did differently from the formatter does not count, and then migrated. On every file the
migration changed:

* ``ruff check --select E,F,I`` (line length 120) reports no finding the input did not have:
  for each rule code, the output has at most as many findings as the input;
* ``ruff format --check`` passes: the migration keeps a formatted file formatted (imports
  sorted, long generated lines wrapped, blank lines around the generated functions).

Both sides are linted outside this repository, so ``roundpipe`` is a third-party package to
the import sorter, as it is in a user's project. One ruff call covers all files of a side.
"""

from __future__ import annotations

import collections
import json
import pathlib
import subprocess
import sys
from typing import Counter, Dict, Iterator, List, Tuple

import pytest

from migrate.engine import migrate_source
from migrate.project import migrate_project
from migrate.rules import all_rules

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "migrate_cases"
PROJECT_FOLDERS = sorted(p for p in (CASES / "projects").iterdir() if p.is_dir()) + sorted(
    p for p in (ROOT / "tests" / "migrate_projects").iterdir() if (p / "main.py").is_file()
)
TARGET_FOLDERS = {"expected", "expected_exact"}  # hand-written outputs, not inputs
RUFF_SETTINGS = ["--isolated", "--line-length", "120"]

pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install -e '.[test]'")


def _single_files() -> Iterator[Tuple[str, str]]:
    """(name, text) of every single-file input."""
    for path in sorted((ROOT / "examples").glob("*.py")) + sorted(CASES.glob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()
    for rule in all_rules():
        for index, example in enumerate(rule.examples):
            if example.expect:
                yield f"rules/{rule.name}_{index}.py", example.before


def _projects() -> Iterator[Tuple[str, Dict[str, str]]]:
    """(folder name, {path in the folder: text}) of every project input."""
    for folder in PROJECT_FOLDERS:
        files = {
            path.relative_to(folder).as_posix(): path.read_text()
            for path in sorted(folder.rglob("*.py"))
            if not TARGET_FOLDERS & set(path.relative_to(folder).parts)
        }
        yield str(folder.relative_to(ROOT)), files


def _ruff(*arguments: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *arguments], cwd=cwd, capture_output=True, text=True)


def _write(folder: pathlib.Path, files: Dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def _formatted(inputs: Dict[str, str], work: pathlib.Path) -> Dict[str, str]:
    """``inputs`` after ``ruff format``."""
    _write(work, inputs)
    done = _ruff("format", *RUFF_SETTINGS, ".", cwd=work)
    assert done.returncode == 0, done.stderr
    return {name: (work / name).read_text() for name in inputs}


def _migrate(inputs: Dict[str, str], exact: bool) -> Dict[str, str]:
    """The migrated text of every input the migration changed."""
    single = {name for name, _ in _single_files()}
    changed = {}
    for name in single & set(inputs):
        result = migrate_source(inputs[name], name, exact=exact)
        if result.changed:
            changed[name] = result.migrated
    for folder, files in _projects():
        sources = {name: inputs[f"{folder}/{name}"] for name in files}
        for name, result in migrate_project(sources, exact=exact).items():
            if result.changed:
                changed[f"{folder}/{name}"] = result.migrated
    return changed


def lint_counts(files: Dict[str, str], work: pathlib.Path) -> Dict[str, Counter[str]]:
    """``ruff check --select E,F,I`` findings of ``files``, counted per file and code."""
    _write(work, files)
    done = _ruff("check", *RUFF_SETTINGS, "--select", "E,F,I", "--output-format", "json", "--exit-zero", ".", cwd=work)
    assert done.returncode == 0, done.stderr
    counts: Dict[str, Counter[str]] = {name: collections.Counter() for name in files}
    for finding in json.loads(done.stdout):
        counts[_relative(finding["filename"], work)][finding["code"]] += 1
    return counts


def unformatted(files: Dict[str, str], work: pathlib.Path) -> List[str]:
    """The files of ``files`` that ``ruff format --check`` would reformat."""
    _write(work, files)
    done = _ruff("format", "--check", *RUFF_SETTINGS, "--output-format", "json", ".", cwd=work)
    assert done.returncode in (0, 1), done.stderr
    return sorted(_relative(finding["filename"], work) for finding in json.loads(done.stdout))


def _relative(filename: str, work: pathlib.Path) -> str:
    return pathlib.Path(filename).resolve().relative_to(work.resolve()).as_posix()


def new_findings(inputs: Dict[str, str], outputs: Dict[str, str], work: pathlib.Path) -> Dict[str, Dict[str, int]]:
    """Per output file, the ruff codes found more often in it than in its input."""
    before = lint_counts({name: inputs[name] for name in outputs}, work / "input")
    after = lint_counts(outputs, work / "output")
    return {name: dict(after[name] - before[name]) for name in outputs if after[name] - before[name]}


def _inputs() -> Dict[str, str]:
    inputs = dict(_single_files())
    for folder, files in _projects():
        inputs.update({f"{folder}/{name}": text for name, text in files.items()})
    return inputs


@pytest.mark.parametrize("exact", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["exact", "async"])
def test_migrated_code_adds_no_lint_finding_and_stays_formatted(tmp_path, exact):
    inputs = _formatted(_inputs(), tmp_path / "formatted")
    outputs = _migrate(inputs, exact)
    assert len(outputs) >= 50, sorted(outputs)  # the sweep really covers the fixtures
    assert new_findings(inputs, outputs, tmp_path) == {}
    assert unformatted(outputs, tmp_path / "check") == []


def test_the_comparison_sees_what_a_bad_rewrite_adds(tmp_path):
    source = "import torch\n\n\ndef f():\n    return torch.zeros(1)\n"
    worse = "import os\nimport torch\n\n\ndef f():\n    return torch.zeros(1)  # " + "x" * 120 + "\n\n"
    assert new_findings({"a.py": source}, {"a.py": worse}, tmp_path) == {"a.py": {"I001": 1, "F401": 1, "E501": 1}}
    assert unformatted({"a.py": worse}, tmp_path / "check") == ["a.py"]
    assert unformatted({"a.py": source}, tmp_path / "check") == []
