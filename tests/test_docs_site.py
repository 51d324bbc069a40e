"""The documentation site (mkdocs.yml, docs/) builds under ``mkdocs build --strict``.

Strict mode turns every warning into an error: a broken link or anchor, a nav entry without
its file, a page missing from the nav, a mkdocstrings object that does not resolve or a
docstring griffe cannot parse. The site is bilingual (English, and Chinese under ``zh/``).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_docs_site_builds_strict(tmp_path):
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]') - docs site not built")

    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"

    assert (site / "index.html").is_file()
    assert (site / "zh" / "index.html").is_file()
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert "GradScaler" in reference
    # The Chinese user guide is really Chinese; untranslated pages fall back to English.
    assert "快速上手" in (site / "zh" / "quickstart" / "index.html").read_text(encoding="utf-8")
    # Builds without noise: nothing beyond the plugins' INFO lines (the signature formatter the
    # config asks for, ruff, comes with the test extra).
    noise = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and not line.startswith("INFO")]
    assert noise == [], noise
    # Pages without a Chinese twin say so at the top of their /zh/ copy, and only there.
    for page in ("architecture", "performance", "reference"):
        fallback = (site / "zh" / page / "index.html").read_text(encoding="utf-8")
        assert fallback.index("本页暂无中文版") < fallback.index("<h1"), page
        assert "本页暂无中文版" not in (site / page / "index.html").read_text(encoding="utf-8")
    assert "本页暂无中文版" not in (site / "zh" / "quickstart" / "index.html").read_text(encoding="utf-8")
    # The parity page shows its plots, SVG files that the built site holds.
    parity = (site / "parity" / "index.html").read_text(encoding="utf-8")
    assert parity.count('<img alt="') >= 2 and ".svg" in parity
    for image in set(re.findall(r'src="([^"]+\.svg)"', parity)):
        assert (site / "parity" / image).resolve().is_file(), image


@pytest.mark.parametrize("page", ["parity.md", "parity.zh.md"])
def test_parity_plots_are_the_ones_the_pages_export_command_writes(page):
    """docs/assets/parity holds exactly the panels the page's export command names, and the
    page shows each of them."""
    text = (REPO_ROOT / "docs" / page).read_text(encoding="utf-8")
    command = text.split("python -m compat_matrix.export_plots out/parity/report.json docs/assets/parity", 1)[1]
    panels = re.findall(r"--panel (\S+)", command.split("```", 1)[0])
    files = sorted(path.stem for path in (REPO_ROOT / "docs" / "assets" / "parity").glob("*.svg"))
    assert sorted(panels) == files
    assert sorted(re.findall(r"\(assets/parity/(\S+)\.svg\)", text)) == files
