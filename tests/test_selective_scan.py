"""The PyTorch selective scan that evaluation and interventions run: its cache-sized row
blocks give the bits of the whole batch at once, and the scan the recurrence's."""

import pytest
import torch

from mecheval.models.ops import selective_scan as scan


def _inputs(rows: int, dtype: torch.dtype = torch.float32, length: int = 7):
    g = torch.Generator().manual_seed(rows)
    channels, n = 24, 8
    u = torch.randn(length, rows, channels, generator=g, dtype=dtype)
    dt = torch.rand(length, rows, channels, generator=g, dtype=dtype) * 0.5
    A = -torch.rand(channels, n, generator=g, dtype=dtype) * 4
    B = torch.randn(length, rows, n, generator=g, dtype=dtype)
    C = torch.randn(length, rows, n, generator=g, dtype=dtype)
    initial = torch.randn(rows, channels, n, generator=g, dtype=dtype)
    return u, dt, A, B, C, initial


@pytest.mark.parametrize("start", ["zero", "state before", "state after the first step"])
@pytest.mark.parametrize("neg_eigval", [False, True])
def test_row_blocks_give_the_whole_batchs_bits(
    monkeypatch: pytest.MonkeyPatch, start: str, neg_eigval: bool
) -> None:
    u, dt, A, B, C, initial = _inputs(rows=37)
    kwargs = {
        "keep": False,
        "initial": None if start == "zero" else initial,
        "replace_first": start == "state after the first step",
        "neg_eigval": neg_eigval,
    }
    monkeypatch.setattr(scan, "CACHE_BLOCK", 10**9)  # one block: the whole batch
    whole = scan.scan_with_states(u, dt, A, B, C, **kwargs)[0]
    monkeypatch.setattr(scan, "CACHE_BLOCK", 5 * A.numel())  # blocks of 5 rows, 2 left over
    blocked = scan.scan_with_states(u, dt, A, B, C, **kwargs)[0]
    assert blocked.shape == whole.shape == u.shape
    assert torch.equal(blocked, whole)


def test_blocked_scan_equals_the_recurrence_from_an_initial_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against the step-by-step reference in float64: a prefix's states resumed from the
    cut (the way interventions resume) equal the whole document's outputs after it."""
    monkeypatch.setattr(scan, "CACHE_BLOCK", 3 * 24 * 8)
    u, dt, A, B, C, _ = _inputs(rows=10, dtype=torch.float64, length=9)
    x = u / dt  # the reference takes x and Δ, the time-major scan u = Δx
    D = torch.zeros(u.shape[-1], dtype=torch.float64)
    batch_major = [t.transpose(0, 1) for t in (x, dt, B, C)]
    reference = scan.selective_scan_reference(
        batch_major[0], batch_major[1], A, batch_major[2], batch_major[3], D
    ).transpose(0, 1)
    _, states, _ = scan.scan_with_states(u, dt, A, B, C, keep=True)
    cut = 4
    resumed = scan.scan_with_states(
        u[cut:], dt[cut:], A, B[cut:], C[cut:], keep=False, initial=states[cut - 1]
    )[0]
    torch.testing.assert_close(resumed, reference[cut:], rtol=1e-12, atol=1e-12)
