"""Ending the O1 casts a program left on, between programs run in the test process.

apex's O1 (the stand-in in tests/fake_apex) and roundpipe.compat's O1 both cast for the
whole program from ``initialize`` on, as apex's patches of torch do, and so does a plain
O1 migration (``--apex-target plain``: its generated ``_apex_o1_casts()``): autocast stays on
in the calling thread when the program ends, and a program run after it in the same process
would compute under it.
"""

import functools
import pathlib
import sys

import torch

from roundpipe.compat.global_casts import stop_casting

FAKE_AMP = pathlib.Path(__file__).resolve().parent / "fake_apex" / "apex" / "amp.py"


def end_o1_casts() -> None:
    """Close the O1 casts of every loaded copy of the apex stand-in (under any module
    name), then compat's, then a plain migration's (this thread's autocast off, the cast
    cache on: torch's defaults)."""
    for module in list(sys.modules.values()):
        location = getattr(module, "__file__", None)
        if location is not None and _is_fake_amp(location):
            module._close_casts()
    stop_casting()
    for device_type in ("cpu", "cuda"):
        torch.set_autocast_enabled(device_type, False)
    torch.set_autocast_cache_enabled(True)


@functools.lru_cache(maxsize=None)
def _is_fake_amp(location: str) -> bool:
    """Whether the file at ``location`` is the apex stand-in's amp.py, links resolved (kept
    per location: resolving the thousands of modules torch loads took 0.2 s a test)."""
    return pathlib.Path(location).resolve() == FAKE_AMP
