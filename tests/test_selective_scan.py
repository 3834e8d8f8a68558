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


@pytest.mark.parametrize("start", ["zero", "state before", "state after the first step"])
@pytest.mark.parametrize("neg_eigval", [False, True])
def test_decays_made_step_by_step_give_the_bits_of_all_made_at_once(
    monkeypatch: pytest.MonkeyPatch, start: str, neg_eigval: bool
) -> None:
    """Where a state's D x N fills whole vectors (scan.WHOLE_VECTORS), the scan without kept
    states makes each decay as its step comes, and its readout has the bits of the scan that
    keeps every state and makes every decay first; so do the states of :func:`scan_states`."""
    u, dt, A, B, C, initial = _inputs(rows=37)
    A, initial = A[:16], initial[:, :16]  # 16 x 8 = 128 elements a state
    u, dt = u[..., :16], dt[..., :16]
    assert A.numel() % scan.WHOLE_VECTORS == 0
    kwargs = {
        "initial": None if start == "zero" else initial,
        "replace_first": start == "state after the first step",
        "neg_eigval": neg_eigval,
    }
    kept_y, kept_states, _ = scan.scan_with_states(u, dt, A, B, C, keep=True, **kwargs)
    monkeypatch.setattr(scan, "CACHE_BLOCK", 5 * A.numel())  # blocks of 5 rows, 2 left over
    y = scan.scan_with_states(u, dt, A, B, C, keep=False, **kwargs)[0]
    assert torch.equal(y, kept_y)
    if start == "zero":
        states = scan.scan_states(u, dt, A, B, neg_eigval)
        assert states.shape == kept_states.shape == (*u.shape, A.shape[1])
        assert torch.equal(states, kept_states)


def test_scan_states_resume_to_the_recurrence(monkeypatch: pytest.MonkeyPatch) -> None:
    """In float64, against the step-by-step reference, where D x N fills no whole vectors
    (the decays made a block at a time): the state :func:`scan_states` keeps at a cut, resumed
    from, gives the whole document's outputs after it."""
    monkeypatch.setattr(scan, "CACHE_BLOCK", 3 * 6 * 5)
    u, dt, A, B, C, _ = _inputs(rows=10, dtype=torch.float64, length=9)
    u, dt, A, B, C = u[..., :6], dt[..., :6], A[:6, :5], B[..., :5], C[..., :5]
    assert A.numel() % scan.WHOLE_VECTORS != 0
    batch_major = [t.transpose(0, 1) for t in (u / dt, dt, B, C)]
    D = torch.zeros(6, dtype=torch.float64)
    reference = scan.selective_scan_reference(*batch_major[:2], A, *batch_major[2:], D)
    states = scan.scan_states(u, dt, A, B)
    cut = 4
    resumed = scan.scan_with_states(
        u[cut:], dt[cut:], A, B[cut:], C[cut:], keep=False, initial=states[cut - 1]
    )[0]
    torch.testing.assert_close(resumed, reference.transpose(0, 1)[cut:], rtol=1e-12, atol=1e-12)
