"""Every rule's embedded examples under the line mutations of the fuzz tests: the engine never
crashes, never writes what does not compile, keeps every comment and is idempotent, also on
broken variants of the shapes the rules recognise."""

import io
import tokenize

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.engine import migrate_source
from migrate.rules import all_rules
from mutations import MUTATIONS, mutate_lines

SOURCES = [example.before for rule in all_rules() for example in rule.examples]


def _comments(text):
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return sorted(t.string for t in tokens if t.type == tokenize.COMMENT)


def _mutants():
    lines = st.sampled_from(SOURCES).map(lambda s: s.splitlines(True))
    return lines.flatmap(
        lambda ls: st.tuples(
            st.just(ls),
            st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, max(0, len(ls) - 1))), max_size=3),
        )
    )


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutants(), st.booleans())
def test_mutated_rule_examples_compile_keep_comments_and_are_idempotent(case, exact):
    lines, ops = case
    source = mutate_lines(lines, ops)
    result = migrate_source(source, "mutant.py", exact=exact)
    if not result.changed:
        assert result.migrated == source
        return
    compile(result.migrated, "mutant.py", "exec")
    kept = [c for c in _comments(result.migrated) or [] if "roundpipe-migrate" not in c]
    assert kept == _comments(source)
    again = migrate_source(result.migrated, "mutant.py", exact=exact)
    assert again.migrated == result.migrated and again.diagnostics == []
