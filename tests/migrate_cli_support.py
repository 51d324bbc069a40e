"""What the roundpipe-migrate command line tests share: paths, a sample AMP source and
the in-process runner."""

import os
from pathlib import Path

from migrate import cli

REPO = Path(__file__).resolve().parents[1]
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": str(REPO)}
AMP = "from torch.amp import GradScaler\nscaler = GradScaler()\n"


def run(capsys, *argv):
    """Run the tool in-process; return (exit status, stdout, stderr)."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
