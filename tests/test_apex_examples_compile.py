"""The apex amp example scripts are valid Python and use apex amp the expected way.

apex.amp is not installable here (it was removed from apex in 2025), so these
scripts are only compiled and inspected, never run; their migrated copies are
what runs on CPU.
"""

import re
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"

APEX_EXAMPLES = [
    "apex_o1.py",
    "apex_o2_batchnorm.py",
    "apex_argparse_checkpoint.py",
    "apex_multi_loss.py",
    "apex_old_api.py",
]

STEP_PRINT = re.compile(r'print\(f"step \{step\} loss \{loss\.item\(\):\.6f\}"\)')
SCALE_LOSS = re.compile(r"\bwith (amp|amp_handle)\.scale_loss\(")


@pytest.mark.parametrize("name", APEX_EXAMPLES)
def test_apex_example_compiles_and_uses_amp(name):
    path = EXAMPLES_DIR / name
    text = path.read_text(encoding="utf-8")

    compile(text, str(path), "exec")

    assert "from apex import amp" in text, f"{name} does not import apex amp"
    assert SCALE_LOSS.search(text), f"{name} has no amp.scale_loss / amp_handle.scale_loss block"
    assert "scaled_loss.backward()" in text, f"{name} does not backpropagate the scaled loss"
    assert STEP_PRINT.search(text), f"{name} does not print 'step N loss X'"
    assert 'if __name__ == "__main__":' in text, f"{name} has no __main__ guard"
