import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # Two cores on CI: one thread per test process keeps timings stable and results exact.
    torch.set_num_threads(1)
    yield
