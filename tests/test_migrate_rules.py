"""roundpipe-migrate's rewrite rules on fixture files: every input has its expected output
(or its diagnostic, leaving the file byte-identical), and a no-op twin that must not change;
every case is run twice (idempotence); outputs compile and keep every comment."""

import io
import pathlib
import re
import tokenize

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.engine import migrate_source
from mutations import MUTATIONS, mutate_lines

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "migrate_cases"
EXPECTED = CASES / "expected"
INPUTS = (
    sorted(CASES.glob("*.py"))
    + sorted((ROOT / "examples").glob("amp_*.py"))
    + sorted((ROOT / "examples").glob("apex_*.py"))
)
IDS = [p.name for p in INPUTS]


def _expected_codes(path):
    diag = CASES / (path.stem + ".diag")
    return diag.read_text().split() if diag.exists() else None


def _comments(text):
    return [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]


@pytest.mark.parametrize("path", INPUTS, ids=IDS)
def test_fixture_migrates_to_its_expected_output(path):
    source = path.read_text()
    result = migrate_source(source, str(path))
    codes = _expected_codes(path)
    if codes is not None:
        assert [d.code for d in result.diagnostics] == codes
        assert result.migrated == source  # left byte-identical
        assert result.status == "partial"
    elif path.stem.endswith("_noop"):
        assert result.migrated == source and result.diagnostics == []
    else:
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert result.migrated == (EXPECTED / path.name).read_text()
        assert not re.search(r"^\s*(from apex|import apex)", result.migrated, re.M)  # runs without apex


@pytest.mark.parametrize("exact", [False, True], ids=["async", "exact"])
@pytest.mark.parametrize("path", INPUTS, ids=IDS)
def test_migration_is_idempotent_compiles_and_keeps_comments(path, exact):
    source = path.read_text()
    once = migrate_source(source, str(path), exact=exact)
    twice = migrate_source(once.migrated, str(path), exact=exact)
    assert twice.migrated == once.migrated
    if once.changed:
        assert twice.diagnostics == []
    compile(once.migrated, str(path), "exec")
    assert sorted(_comments(source)) == sorted(c for c in _comments(once.migrated) if "roundpipe-migrate" not in c)


def test_exact_mode_only_adds_the_synchronous_flags():
    source = (ROOT / "examples" / "amp_basic.py").read_text()
    default = migrate_source(source).migrated
    exact = migrate_source(source, exact=True).migrated
    assert exact == default.replace("model.step(_step_fn)", "model.step(_step_fn, is_async=False)")
    assert "scaler.update()" in exact  # a waited-for step needs no update(is_async=False)


def test_legacy_positional_init_scale_is_kept_as_init_scale():
    result = migrate_source((CASES / "legacy_positional.py").read_text())
    assert "roundpipe.GradScaler(2.0 ** 10, 3.0, enabled=torch.cuda.is_available())" in result.migrated
    assert "amp.autocast(torch.cuda.is_available())" in result.migrated  # `enabled`, untouched


def _mutations():
    lines = st.sampled_from(INPUTS).map(lambda p: p.read_text().splitlines(True))
    return lines.flatmap(
        lambda ls: st.tuples(
            st.just(ls),
            st.lists(
                st.tuples(st.sampled_from(MUTATIONS), st.integers(0, max(0, len(ls) - 1))), min_size=1, max_size=4
            ),
        )
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_mutated_inputs_never_crash_and_never_emit_invalid_code(case):
    lines, ops = case
    source = mutate_lines(lines, ops)
    result = migrate_source(source, "mutant.py")
    if result.changed:
        compile(result.migrated, "mutant.py", "exec")
        again = migrate_source(result.migrated, "mutant.py")
        assert again.migrated == result.migrated
    else:
        assert result.migrated == source


def test_duplicated_training_code_is_reported_not_crashed():
    """Found by the mutation test: a duplicated optimizer line made two rules edit the same
    statements; the file must come back unchanged with a diagnostic."""
    lines = (ROOT / "examples" / "amp_train_function.py").read_text().splitlines(True)
    source = mutate_lines(lines, [("dup", 51)])
    result = migrate_source(source, "dup.py")
    if result.changed:
        compile(result.migrated, "dup.py", "exec")
    else:
        assert result.migrated == source and result.diagnostics


def test_result_records_every_change_with_original_and_new_lines():
    """The report's data: inserted header, the zero_grad moved into the step function (with
    its line before and after), the removed backward line; ranges point at the real text."""
    source = (ROOT / "examples" / "amp_basic.py").read_text()
    result = migrate_source(source)
    before, after = source.splitlines(), result.migrated.splitlines()
    kinds = {c.kind for c in result.changes}
    assert {"inserted", "moved", "removed", "replaced"} <= kinds
    moved = next(c for c in result.changes if c.kind == "moved")
    assert before[moved.original[0] - 1].strip() == "optimizer.zero_grad(set_to_none=True)"
    assert "optimizer.zero_grad(set_to_none=True)" in [line.strip() for line in after[moved.new[0] - 1 : moved.new[1]]]
    removed = [before[c.original[0] - 1].strip() for c in result.changes if c.kind == "removed"]
    assert "scaler.scale(loss).backward()" in removed
    assert result.changes[0].to_json() == {"kind": "inserted", "original_lines": None, "new_lines": [7, 7]}
    assert after[6] == "import roundpipe"  # sorted into the import block
    assert migrate_source("x = 1\n").changes == []


TWO_BLOCKERS = """import torch


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in batches:
        loss = model(x).sum()
        scaler.scale(loss).backward(create_graph=True)
        scaler.step(optimizer)
        scaler.update()


class Trainer:
    def step(self, loss):
        self.scaler.scale(loss).backward()
"""


def test_every_blocker_in_a_file_is_reported_at_its_line():
    """Independent blockers are all reported, each where it blocks, without follow-on noise
    (the create_graph backward is not also called an unfollowed scaler)."""
    result = migrate_source(TWO_BLOCKERS, "two.py")
    assert [(d.line, d.code) for d in result.diagnostics] == [(9, "RPM103"), (16, "RPM104")]
    assert result.migrated == TWO_BLOCKERS


THROUGH_A_LAMBDA = """
import torch


def train(model, optimizer):
    scaler = torch.amp.GradScaler("cpu")
    for step in range(3):
        with torch.autocast("cpu"):
            loss = model(torch.randn(2, 4)).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


run = lambda model, optimizer: train(model, optimizer)
net = torch.nn.Linear(4, 4)
run(net, torch.optim.SGD(net.parameters(), lr=0.1))
"""


def test_an_optimizer_passed_in_by_a_lambda_is_not_followed_and_says_so():
    """The optimizer comes through a lambda's parameter: a lambda is no function whose callers
    the migration follows (libcst gives it a function scope too); refused at the call in
    the lambda (it crashed with RPM904: a lambda has no name)."""
    result = migrate_source(THROUGH_A_LAMBDA, "lambda.py")
    assert [(d.line, d.code) for d in result.diagnostics] == [(16, "RPM108")]
    assert "cannot follow 'optimizer' to where it is built" in result.diagnostics[0].message
    assert result.migrated == THROUGH_A_LAMBDA
