"""Original apex scripts against their migrations, where apex (<= 25.05) and CUDA both exist.

Skipped elsewhere (the markers say why). Same seed: the scale trajectory must be identical
and the printed losses close (apex's O1 op lists differ from torch.autocast's)."""

import contextlib
import io
import pathlib
import re
import runpy

import pytest

from migrate.engine import migrate_source

pytestmark = [pytest.mark.apex, pytest.mark.cuda]
ROOT = pathlib.Path(__file__).resolve().parent.parent
STEP = re.compile(r"^step (\d+) loss (\S+)", re.M)


def _losses(source, tmp_path, name):
    script = tmp_path / name
    script.write_text(source)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    return [float(v) for _, v in STEP.findall(out.getvalue())]


@pytest.mark.parametrize("name", ["apex_o1.py", "apex_o2_batchnorm.py", "apex_multi_loss.py"])
def test_original_apex_script_and_its_exact_migration_agree(name, tmp_path, monkeypatch):
    from apex import amp

    source = (ROOT / "examples" / name).read_text()
    original = _losses(source, tmp_path, "original_" + name)
    scales_apex = [s.loss_scale() for s in amp._amp_state.loss_scalers]
    migrated = migrate_source(source, name, exact=True).migrated
    ours = _losses(migrated, tmp_path, "migrated_" + name)
    import roundpipe.compat

    assert roundpipe.compat.loss_scaler().get_scale() == scales_apex[0]
    assert ours == pytest.approx(original, rel=2e-2, abs=1e-3)
