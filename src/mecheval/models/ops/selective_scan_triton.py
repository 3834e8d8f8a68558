"""Mamba's selective scan as two Triton kernels (forward, backward): the GPU form of
:func:`~mecheval.models.ops.selective_scan.selective_scan`.

Why: on a GPU the PyTorch form walks time in ~13 tiny kernels per position (forward and
backward), so at the paper's sizes a Mamba step is launch-bound, even replayed as a CUDA
graph. Here one program holds a block of channels' [channels, N] states in registers and walks
time once: one launch for the forward, one for the backward, each reading its inputs once.

The scan is the one :func:`~mecheval.models.ops.selective_scan.selective_scan_reference`
writes out (without D, which the caller adds): h_t = a_t ⊙ h_{t-1} + Δ_t x_t B_t,
y_t = h_t C_t, a_t = exp(Δ_t A) (or 2 exp(Δ_t A) - 1 with ``neg_eigval``). The backward
is :class:`~mecheval.models.ops.selective_scan._SelectiveScan`'s adjoint; the forward keeps
every state for it.

Stacks of runs: both kernels take a leading *group* dimension (one per stacked model, each
with its own A), and each runs inside an autograd.Function whose vmap rule folds the vmapped
dimension into it (:func:`~mecheval.models.ops.triton_path.fold`), so
``vmap(grad_and_value(...))`` (training/stacking/group_trainer.py) runs one launch for the whole
stack. Triton also runs these kernels on the CPU under ``TRITON_INTERPRET=1``, which is how
the tests without a GPU hold them to the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mecheval.models.ops.triton_path import KernelGradient, fold, unfold

#: Channels per program: the state block [BLOCK_D, N] stays in registers.
BLOCK_D = 32


@triton.jit
def _forward_kernel(
    x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, y_ptr, h_ptr,
    rows_per_group, length, channels, n_state,
    NEG: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_ok = d < channels
    dn_ok = d_ok[:, None] & (n < n_state)[None, :]
    group = row // rows_per_group
    a_log = tl.load(a_ptr + group * channels * n_state + d[:, None] * n_state + n[None, :],
                    mask=dn_ok, other=0.0)  # fmt: skip
    h = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    for t in range(length):
        pos = row * length + t
        x = tl.load(x_ptr + pos * channels + d, mask=d_ok, other=0.0)
        dt = tl.load(dt_ptr + pos * channels + d, mask=d_ok, other=0.0)
        b = tl.load(b_ptr + pos * n_state + n, mask=n < n_state, other=0.0)
        c = tl.load(c_ptr + pos * n_state + n, mask=n < n_state, other=0.0)
        decay = tl.exp(dt[:, None] * a_log)
        if NEG:
            decay = 2 * decay - 1
        h = decay * h + (dt * x)[:, None] * b[None, :]
        tl.store(y_ptr + pos * channels + d, tl.sum(h * c[None, :], axis=1), mask=d_ok)
        tl.store(h_ptr + (pos * channels + d[:, None]) * n_state + n[None, :], h, mask=dn_ok)


@triton.jit
def _backward_kernel(
    x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, h_ptr, dy_ptr,
    dx_ptr, ddt_ptr, da_ptr, db_ptr, dc_ptr,
    rows, rows_per_group, length, channels, n_state,
    NEG: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    block = tl.program_id(1)
    d = block * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_ok = d < channels
    n_ok = n < n_state
    dn_ok = d_ok[:, None] & n_ok[None, :]
    group = row // rows_per_group
    a_log = tl.load(a_ptr + group * channels * n_state + d[:, None] * n_state + n[None, :],
                    mask=dn_ok, other=0.0)  # fmt: skip
    g = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)  # the adjoint of h_t, decayed
    da = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    zero = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.int32)  # t as a block, for the mask at t = 0
    for step in range(length):
        t = length - 1 - step
        pos = row * length + t
        x = tl.load(x_ptr + pos * channels + d, mask=d_ok, other=0.0)
        dt = tl.load(dt_ptr + pos * channels + d, mask=d_ok, other=0.0)
        dy = tl.load(dy_ptr + pos * channels + d, mask=d_ok, other=0.0)
        b = tl.load(b_ptr + pos * n_state + n, mask=n_ok, other=0.0)
        c = tl.load(c_ptr + pos * n_state + n, mask=n_ok, other=0.0)
        h = tl.load(h_ptr + (pos * channels + d[:, None]) * n_state + n[None, :],
                    mask=dn_ok, other=0.0)  # fmt: skip
        h_prev = tl.load(h_ptr + ((pos - 1) * channels + d[:, None]) * n_state + n[None, :],
                         mask=dn_ok & (zero + t > 0), other=0.0)  # fmt: skip
        g = g + dy[:, None] * c[None, :]
        u = dt * x
        du = tl.sum(g * b[None, :], axis=1)
        # B and C are shared by every channel: each channel block writes its part, summed after.
        part = (block * rows * length + pos) * n_state + n
        tl.store(dc_ptr + part, tl.sum(dy[:, None] * h, axis=0), mask=n_ok)
        tl.store(db_ptr + part, tl.sum(g * u[:, None], axis=0), mask=n_ok)
        decay = tl.exp(dt[:, None] * a_log)
        if NEG:
            decay = 2 * decay - 1
            dlog = g * (decay + 1) * h_prev  # d(2 exp(z) - 1)/dz = decay + 1
        else:
            dlog = g * decay * h_prev
        da += dlog * dt[:, None]
        tl.store(dx_ptr + pos * channels + d, du * dt, mask=d_ok)
        tl.store(ddt_ptr + pos * channels + d, du * x + tl.sum(dlog * a_log, axis=1), mask=d_ok)
        g = g * decay
    tl.store(da_ptr + (row * channels + d[:, None]) * n_state + n[None, :], da, mask=dn_ok)


def _launch_shape(x: torch.Tensor) -> tuple[int, int, int, int, tuple[int, int]]:
    groups, rows, length, channels = x.shape
    return groups, rows, length, channels, (groups * rows, triton.cdiv(channels, BLOCK_D))


def scan_forward(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    neg_eigval: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x, dt [G, R, T, D]; A [G, D, N]; B, C [G, R, T, N], float32 -> y [G, R, T, D] and every
    state [G, R, T, D, N]."""
    x, dt, A, B, C = (t.contiguous() for t in (x, dt, A, B, C))
    _, rows, length, channels, grid = _launch_shape(x)
    n_state = A.shape[-1]
    y = torch.empty_like(x)
    states = x.new_empty(*x.shape, n_state)
    _forward_kernel[grid](
        x, dt, A, B, C, y, states, rows, length, channels, n_state,
        NEG=neg_eigval, BLOCK_D=BLOCK_D, BLOCK_N=triton.next_power_of_2(n_state),
    )  # fmt: skip
    return y, states


def scan_backward(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    states: torch.Tensor, dy: torch.Tensor, neg_eigval: bool,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """The gradients of :func:`scan_forward`'s y in x, dt, A, B, C, given dy and its states."""
    x, dt, A, B, C, states, dy = (t.contiguous() for t in (x, dt, A, B, C, states, dy))
    groups, rows, length, channels, grid = _launch_shape(x)
    n_state = A.shape[-1]
    dx, ddt = torch.empty_like(x), torch.empty_like(x)
    da_rows = x.new_empty(groups * rows, channels, n_state)
    db_parts = x.new_empty(grid[1], groups * rows, length, n_state)
    dc_parts = torch.empty_like(db_parts)
    _backward_kernel[grid](
        x, dt, A, B, C, states, dy, dx, ddt, da_rows, db_parts, dc_parts,
        groups * rows, rows, length, channels, n_state,
        NEG=neg_eigval, BLOCK_D=BLOCK_D, BLOCK_N=triton.next_power_of_2(n_state),
    )  # fmt: skip
    dA = da_rows.view(groups, rows, channels, n_state).sum(1)
    return dx, ddt, dA, db_parts.sum(0).view(B.shape), dc_parts.sum(0).view(C.shape)


class _Scan(torch.autograd.Function):
    """:func:`scan_forward` with :func:`scan_backward` as its gradient. Its vmap rule folds a
    stack of runs into the groups, so a vmapped step launches each kernel once."""

    @staticmethod
    def forward(x, dt, A, B, C, neg_eigval):  # type: ignore[override]
        return scan_forward(x, dt, A, B, C, neg_eigval)

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple
    ) -> None:
        ctx.save_for_backward(*inputs[:5], output[1])
        ctx.neg_eigval = inputs[5]
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, dy, _dstates):  # type: ignore[override]
        x, dt, A, B, C, states = ctx.saved_tensors
        return (*_ScanGrad.apply(x, dt, A, B, C, states, dy, ctx.neg_eigval), None)

    @staticmethod
    def vmap(info, in_dims, x, dt, A, B, C, neg_eigval):  # type: ignore[override]
        k = info.batch_size
        folded = (fold(k, t, dim) for t, dim in zip((x, dt, A, B, C), in_dims[:5], strict=True))
        y, states = _Scan.apply(*folded, neg_eigval)
        return (unfold(k, y), unfold(k, states)), (0, 0)


class _ScanGrad(KernelGradient):
    """:func:`scan_backward` as a function torch.func can vmap (not differentiable again)."""

    @staticmethod
    def forward(x, dt, A, B, C, states, dy, neg_eigval):  # type: ignore[override]
        return scan_backward(x, dt, A, B, C, states, dy, neg_eigval)

    @staticmethod
    def vmap(info, in_dims, x, dt, A, B, C, states, dy, neg_eigval):  # type: ignore[override]
        k = info.batch_size
        tensors = (x, dt, A, B, C, states, dy)
        folded = (fold(k, t, dim) for t, dim in zip(tensors, in_dims[:7], strict=True))
        grads = _ScanGrad.apply(*folded, neg_eigval)
        return tuple(unfold(k, g) for g in grads), (0,) * 5


def selective_scan_triton(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    neg_eigval: bool = False,
) -> torch.Tensor:
    """The scan without D in the module's layout (x, delta [batch, T, D]; A [D, N];
    B, C [batch, T, N]) -> y [batch, T, D]."""
    args = (t.unsqueeze(0) for t in (x, delta, A, B, C))
    return _Scan.apply(*args, neg_eigval)[0].squeeze(0)
