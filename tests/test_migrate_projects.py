"""roundpipe-migrate on whole training projects (tests/migrate_projects/, issue 10).

Each folder there is a small, runnable training program written the way public projects
write theirs (one shape of issue 10 each, entry point ``main.py``). For every project the
harness runs the original, then ``roundpipe-migrate --exact -o OUT PROJECT``, and holds the
tool to its promise of never being wrong and never silent:

* if the tool changed any file, it must not have refused anything in the project (no
  half-migrated program, no file still on apex.amp), and the migrated program must print
  exactly what the original printed; the default (asynchronous) migration must print as
  many steps;
* if it changed nothing, every file is byte-identical and at least one diagnostic names a
  file of the project (a refusal, or an informational note where nothing needs changing).

Projects with an ``expected_exact/`` folder also carry the hand-written RoundPipe program
the engine should reach; that program must print the original's output too, and the tool
must leave it alone (idempotence). What the tool gets wrong today is listed below as strict
expected failures, so that each fix shows up as an unexpected pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pathlib
import re
import runpy
import sys
from typing import Dict, List, Sequence

import pytest
import torch

from migrate import cli
from o1_casts import end_o1_casts

TESTS = pathlib.Path(__file__).resolve().parent
PROJECTS_ROOT = TESTS / "migrate_projects"
FAKE_APEX = TESTS / "fake_apex"
TARGET = "expected_exact"
PROJECTS = sorted(p.name for p in PROJECTS_ROOT.iterdir() if (p / "main.py").is_file())
TARGETS = [name for name in PROJECTS if (PROJECTS_ROOT / name / TARGET / "main.py").is_file()]

# Projects with a switch between an AMP and a plain path run both ways.
ARGV_VARIANTS: Dict[str, List[List[str]]] = {
    "optional_amp_none": [[], ["--no-amp"]],
    "loss_scaler_timm": [[], ["--no-amp"]],
    "trainer_optional_amp": [[], ["--disable-amp"]],
    "two_path_amp": [[], ["--precision", "fp32"]],
    "two_path_split_backward": [[], ["--no-amp"]],
    "two_path_split_trainer": [[], ["--no-amp"]],
    "autocast_ctx_microsteps": [[], ["--dtype", "float32"]],
    "torchvision_reference": [[], ["--no-amp"]],
    "yolo_accumulate": [[], ["--no-amp"]],
    "hf_glue_loop": [[], ["--no-fp16"]],
    "dino_teacher_student": [[], ["--no-use-fp16"]],
    "dino_utils_helpers": [[], ["--no-use-fp16"]],
    "timm_ema_clip_mode": [[], ["--no-amp", "--clip-mode", "agc"]],
    "tacotron2_apex": [[], ["--no-fp16-run"]],
    "simclr_info_nce": [[], ["--no-fp16-precision"]],
    "moco_v3_momentum": [[], ["--optimizer", "adamw", "--moco-m-cos"]],
    "seq2seq_finetune": [[], ["--no-fp16", "--no-freeze-encoder"]],
    "bert_pretrain_apex": [[], ["--no-fp16"]],
    "trainer_optimizer_factory": [[], ["sgd"], ["adamw", "fixed"]],
    "openclip_accum_features": [[], ["--precision", "fp32"], ["--accum-freq", "1"]],
    "yolox_trainer_hooks": [[], ["--no-fp16"]],
    "nnunet_lifecycle": [[], ["--disable-amp"]],
    "espnet_classmethod": [[], ["--no-use-amp"]],
    "hf_no_trainer_resume": [[], ["--no-fp16", "--lr_scheduler_type", "cosine"]],
    "fairseq_lazy_optimizer": [[], ["--no-amp"]],
    "amp_helper_same_file": [[], ["--clip", "0"]],
    "trainer_tuple_aliases": [[], ["--no-amp"]],
}
# The fast subset (run by default); the full sweep is marked slow.
FAST = {
    "trainer_class",
    "loss_scaler_wrapper",
    "optional_amp_none",
    "gan_shared_scaler",
    "two_path_amp",
    "two_path_split_backward",
}
# Projects the tool gets wrong today: expected failures, strict, so that a fix is noticed
# (and the entry removed) the day the tool stops getting them wrong.
KNOWN_WRONG: Dict[str, str] = {}

FINAL_SCALE = re.compile(r"^final scale ", re.M)
STEP_LINE = re.compile(r"^step \d+ ", re.M)
APEX_AMP = re.compile(r"^\s*(from apex import amp|import apex\.amp|from apex\.amp import)", re.M)
DIAGNOSTIC = re.compile(r"^(?P<path>.+?):\d+:\d+: (?P<code>RPM\d{3}) ", re.M)


def _project_files(folder: pathlib.Path) -> Dict[str, bytes]:
    """Every file of a project (relative path -> bytes), without the target folder."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and TARGET not in path.relative_to(folder).parts and "__pycache__" not in path.parts
    }


def _copy_project(source: Dict[str, bytes], folder: pathlib.Path) -> pathlib.Path:
    for rel, data in source.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def run_program(folder: pathlib.Path, argv: Sequence[str] = ()) -> str:
    """Run ``folder/main.py`` as ``__main__`` in this process; return what it printed.

    The project's folder (and the apex stand-in) lead ``sys.path`` while it runs, and the
    project's own modules are dropped from ``sys.modules`` afterwards, so projects that
    share module names (``trainer``, ``engine``) never see each other's code.
    """
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    saved_torch = dict(vars(torch))  # apex's register_*_function replaces torch functions
    sys.path[:0] = [str(folder), str(FAKE_APEX)]
    sys.argv = [str(folder / "main.py"), *argv]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(folder / "main.py"), run_name="__main__")
    finally:
        end_o1_casts()
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        vars(torch).update(saved_torch)
        for name, module in list(sys.modules.items()):
            location = getattr(module, "__file__", None) or ""
            if location.startswith(str(folder)) or location.startswith(str(FAKE_APEX)):
                del sys.modules[name]
    return out.getvalue()


@dataclasses.dataclass
class Migration:
    exit_code: int
    changed: Dict[str, bytes]  # relative path -> migrated text, for the files written
    codes: List[str]  # diagnostic codes, in the order printed
    diagnosed: List[str]  # the paths the diagnostics name


def migrate_project(folder: pathlib.Path, out: pathlib.Path, exact: bool) -> Migration:
    """``roundpipe-migrate [--exact] -o out folder``, through the command line entry."""
    err = io.StringIO()
    argv = ["--exclude", TARGET, "-o", str(out), str(folder)] + (["--exact"] if exact else [])
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    changed = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    found = list(DIAGNOSTIC.finditer(err.getvalue()))
    return Migration(code, changed, [m["code"] for m in found], [m["path"] for m in found])


def _numbers(output: str) -> str:
    """The printed record of a run (all of it), after checking it has the steps and the
    final scale every project prints."""
    assert len(STEP_LINE.findall(output)) >= 4, f"the program printed too few steps:\n{output}"
    assert FINAL_SCALE.search(output), f"the program must print its final scale:\n{output}"
    return output


def check_project(name: str, tmp_path: pathlib.Path) -> Migration:
    """The whole contract for one project; returns the ``--exact`` migration's outcome."""
    source = _project_files(PROJECTS_ROOT / name)
    original = _copy_project(source, tmp_path / "original")
    variants = ARGV_VARIANTS.get(name, [[]])
    outputs = [run_program(original, argv) for argv in variants]
    expected = [_numbers(output) for output in outputs]
    exact = migrate_project(original, tmp_path / "exact", exact=True)
    assert _project_files(original) == source, "-o must never touch the originals"
    refusals = [c for c in exact.codes if not c.startswith("RPM3")]
    if not exact.changed:
        assert exact.codes, f"{name}: nothing migrated and nothing said"
        assert exact.exit_code == (1 if refusals else 0)
        assert any(pathlib.Path(p).resolve().is_relative_to(original.resolve()) for p in exact.diagnosed)
        return exact
    assert not refusals, f"{name}: files {sorted(exact.changed)} changed while {refusals} refused"
    assert set(exact.changed) <= set(source)
    still_apex = [rel for rel, text in exact.changed.items() if APEX_AMP.search(text.decode())]
    assert not still_apex, f"{name}: migrated files still use apex.amp: {still_apex}"
    migrated = _copy_project({**source, **exact.changed}, tmp_path / "migrated")
    for argv, numbers in zip(variants, expected):
        assert _numbers(run_program(migrated, argv)) == numbers
    default = migrate_project(original, tmp_path / "default", exact=False)
    assert default.changed and not [c for c in default.codes if not c.startswith("RPM3")]
    lagged = _copy_project({**source, **default.changed}, tmp_path / "lagged")
    for argv, output in zip(variants, outputs):
        assert len(STEP_LINE.findall(run_program(lagged, argv))) == len(STEP_LINE.findall(output))
    return exact


def _sweep(names, known_wrong=KNOWN_WRONG):
    def marks(name):
        found = [] if name in FAST else [pytest.mark.slow]
        if name in known_wrong:
            found.append(pytest.mark.xfail(reason=known_wrong[name], raises=AssertionError, strict=True))
        return found

    return [pytest.param(n, marks=marks(n)) for n in names]


@pytest.mark.parametrize("name", _sweep(PROJECTS))
def test_project_is_migrated_to_the_same_numbers_or_refused_untouched(name, tmp_path):
    check_project(name, tmp_path)


@pytest.mark.parametrize("name", _sweep(TARGETS, known_wrong={}))
def test_hand_migrated_target_prints_the_originals_numbers(name, tmp_path):
    folder = PROJECTS_ROOT / name
    target = folder / TARGET
    target_files = {rel for rel in _project_files(target) if rel.endswith(".py")}
    assert target_files == {rel for rel in _project_files(folder) if rel.endswith(".py")}
    assert (
        "import roundpipe" in (target / "main.py").read_text() or "from roundpipe" in (target / "main.py").read_text()
    )
    original = _copy_project(_project_files(folder), tmp_path / "original")
    migrated = _copy_project(_project_files(target), tmp_path / "target")
    for argv in ARGV_VARIANTS.get(name, [[]]):
        assert _numbers(run_program(migrated, argv)) == _numbers(run_program(original, argv))


# Targets the tool does not yet recognise as already migrated.
TARGETS_REPORTED: Dict[str, str] = {}


@pytest.mark.parametrize("name", _sweep(TARGETS, known_wrong=TARGETS_REPORTED))
def test_hand_migrated_target_is_left_alone_by_the_tool(name, tmp_path):
    """Idempotence (MIGRATE.md): a program already in RoundPipe form is neither changed nor
    reported."""
    target = _copy_project(_project_files(PROJECTS_ROOT / name / TARGET), tmp_path / "target")
    outcome = migrate_project(target, tmp_path / "out", exact=True)
    assert (outcome.exit_code, outcome.changed, outcome.codes) == (0, {}, [])


def test_harness_catches_a_half_migrated_project(tmp_path, monkeypatch):
    """The harness itself fails when one file is changed while another is refused."""
    project = _copy_project(_project_files(PROJECTS_ROOT / "trainer_class"), tmp_path / "p")
    (project / "extra.py").write_text("import torch\nscaler = torch.amp.GradScaler()\n")

    def half(argv):
        out = pathlib.Path(argv[argv.index("-o") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "extra.py").write_text("import roundpipe\nscaler = roundpipe.GradScaler()\n")
        print(f"{project / 'main.py'}:1:1: RPM105 refused", file=sys.stderr)
        return 1

    monkeypatch.setattr(cli, "main", half)
    monkeypatch.setattr(sys.modules[__name__], "PROJECTS_ROOT", tmp_path)
    with pytest.raises(AssertionError, match="changed while"):
        check_project("p", tmp_path / "run")


def test_harness_catches_a_migration_that_changes_the_numbers(tmp_path, monkeypatch):
    project = _copy_project(_project_files(PROJECTS_ROOT / "trainer_class"), tmp_path / "p")
    main_py = (project / "main.py").read_text()

    def wrong(argv):
        out = pathlib.Path(argv[argv.index("-o") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "main.py").write_text(main_py.replace("lr=3e-3", "lr=4e-3"))
        return 0

    monkeypatch.setattr(cli, "main", wrong)
    monkeypatch.setattr(sys.modules[__name__], "PROJECTS_ROOT", tmp_path)
    with pytest.raises(AssertionError):
        check_project("p", tmp_path / "run")
