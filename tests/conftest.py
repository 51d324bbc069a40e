"""Shared pytest setup: device markers skip with a reason when the hardware is absent."""

import time

import pytest
import torch

from o1_casts import end_o1_casts
from roundpipe import optim_stream


@pytest.fixture(autouse=True)
def _optimizer_stream_is_drained_after_each_test():
    """A test must not leave failing or running optimizer work behind for the next one."""
    yield
    optim_stream.synchronize("the end of the test")


@pytest.fixture(autouse=True)
def _o1_casts_end_with_each_test():
    """O1 casts from ``initialize`` on, for the rest of the thread (as apex's patches of
    torch): a test's O1 must not reach the next test."""
    yield
    end_o1_casts()


@pytest.fixture
def slow_step(monkeypatch):
    """``torch.optim.SGD.step`` sleeps first, so an asynchronous step is still running when
    the main thread goes on: a read that does not wait for it sees old weights."""
    plain_step = torch.optim.SGD.step

    def slowed(self, closure=None):
        time.sleep(0.05)
        return plain_step(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", slowed)


def pytest_collection_modifyitems(config, items):
    # Markers, not ``item.keywords``: keywords also hold the names of the folders above a
    # test, so a checkout in a folder called ``apex`` or ``cuda`` would skip every test.
    if not torch.cuda.is_available():
        skip_cuda = pytest.mark.skip(reason="CUDA is not available on this machine")
        for item in items:
            if item.get_closest_marker("cuda") is not None:
                item.add_marker(skip_cuda)
    try:
        import apex.amp  # noqa: F401

        has_apex = True
    except Exception:  # noqa: BLE001 - any import failure means "no usable apex"
        has_apex = False
    if not has_apex:
        skip_apex = pytest.mark.skip(reason="apex.amp is not importable (apex <= 25.05 needed)")
        for item in items:
            if item.get_closest_marker("apex") is not None:
                item.add_marker(skip_apex)
