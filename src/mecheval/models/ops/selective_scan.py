"""Mamba's selective scan: h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t, y_t = C_t · h_t + D ⊙ x_t.

:func:`selective_scan_reference` is the recurrence written out step by step, the form the
tests hold the others to; :func:`selective_scan` is what the module runs: in a CPU training
step the scan in C (``csrc/selective_scan.c`` through models/native.py), in a CUDA training
step two Triton kernels (selective_scan_triton.py), otherwise a PyTorch form with a
written-out adjoint.

``neg_eigval`` (Grazzi et al., 2025, "Unlocking State-Tracking in Linear RNNs Through Negative
Eigenvalues") widens the transition from exp(Δ_t A) ∈ (0, 1) to 2 exp(Δ_t A) - 1 ∈ (-1, 1);
the drive Δ_t B_t x_t is unchanged. The C and fused CUDA kernels compute exp(Δ_t A) only, so
with it the Triton or the PyTorch form runs (both adjoints take the widened transition).
"""

from __future__ import annotations

import torch

from mecheval.models import kernels, native
from mecheval.models.ops.triton_path import triton_for_training

#: The selective scan without D (x, delta [batch, T, D]; A [D, N]; B, C [batch, T, N], all
#: contiguous) by ``csrc/selective_scan.c``: the forward keeps nothing but its inputs, the
#: backward recomputes each row's states in C and returns every gradient.
_NativeScan = native.autograd_function(
    "selective_scan",
    sizes=lambda x, delta, A, B, C: (*x.shape, A.shape[1]),
    output=lambda x, *_: torch.empty_like(x),
)


def selective_scan_reference(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    neg_eigval: bool = False,
) -> torch.Tensor:
    """The recurrence written out one step at a time (the specification, not for speed).

    x, delta: [batch, T, d_inner] (delta already softplus-ed); A: [d_inner, N];
    B, C: [batch, T, N]; D: [d_inner] -> y: [batch, T, d_inner]. ``neg_eigval``: the
    transition is 2 exp(Δ_t A) - 1 instead of exp(Δ_t A).
    """
    batch, length, channels = x.shape
    h = x.new_zeros(batch, channels, A.shape[1])
    ys = []
    for t in range(length):
        decay = torch.exp(delta[:, t, :, None] * A[None, :, :])
        if neg_eigval:
            decay = 2 * decay - 1
        drive = delta[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]
        h = decay * h + drive
        y = (h * C[:, t, None, :]).sum(-1) + D * x[:, t]
        ys.append(y)
    return torch.stack(ys, dim=1)


def selective_scan(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    neg_eigval: bool = False,
) -> torch.Tensor:
    """Same function as :func:`selective_scan_reference`, arranged for speed on a CPU.

    The cost is memory traffic on [T, batch, d_inner, N] tensors (9 MB each at the paper's AR
    shape, d = 64), not arithmetic. Autograd through a whole-tensor formulation made ~20 passes
    over such tensors; :class:`_SelectiveScan` walks time in [batch, d_inner, N] slabs that
    stay in the core's cache, computes the readout and every gradient inside that walk, and
    keeps only the states and decays for the backward pass. Without gradients it keeps no
    states at all. A chunked (SSD-style) form does not fit Mamba-1: its decay differs per
    channel *and* state, so a chunk's decay matrix is [batch, d_inner, N, c, c], c times the
    scan's traffic.

    With ``neg_eigval`` the fused CUDA kernel and the C kernel, which compute exp(Δ_t A) only,
    are skipped: the Triton kernels (CUDA training) or the PyTorch form below run.
    """
    if not neg_eigval:
        fused = kernels.selective_scan(x, delta, A, B, C, D)
        if fused is not None:
            return fused
        if native.for_training("selective_scan", x, delta, A, B, C) is not None:
            return _NativeScan.apply(*(t.contiguous() for t in (x, delta, A, B, C))) + x * D
    if triton_for_training("selective_scan", x, delta, A, B, C):
        from mecheval.models.ops.selective_scan_triton import selective_scan_triton

        return selective_scan_triton(x, delta, A, B, C, neg_eigval) + x * D
    xt = x.transpose(0, 1)
    dt = delta.transpose(0, 1).contiguous()
    u = (dt * xt).contiguous()
    bt, ct = B.transpose(0, 1).contiguous(), C.transpose(0, 1).contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (u, dt, A, bt, ct)):
        y = _SelectiveScan.apply(u, dt, A, bt, ct, neg_eigval)[0]
    else:
        y = scan_with_states(u, dt, A, bt, ct, keep=False, neg_eigval=neg_eigval)[0]
    return (y + xt * D).transpose(0, 1)


#: Elements of the state a CPU scan without kept states holds at a time: 512 KB in float32
#: (64 rows at the paper's d_inner = 128, N = 16), so that a step's few state-sized tensors
#: stay within a core's L2 cache.
CACHE_BLOCK = 1 << 17

#: A vectorised elementwise kernel of PyTorch's CPU backend handles the elements past its last
#: whole pair of vectors with a scalar routine, whose exp may round differently. Where a
#: state's D x N is a multiple of this (two AVX-512 vectors of float32, twice over), no
#: tensor of whole states has such a tail, so a decay computed one step at a time has the
#: bits of the decays computed over every step at once.
WHOLE_VECTORS = 64


def _row_blocks(u: torch.Tensor, A: torch.Tensor) -> list[slice]:
    """The batch rows of a CPU scan in blocks whose state fits :data:`CACHE_BLOCK`."""
    rows = max(1, CACHE_BLOCK // A.numel())
    return [slice(r, r + rows) for r in range(0, u.shape[1], rows)]


def _decays(dt: torch.Tensor, A: torch.Tensor, neg_eigval: bool) -> torch.Tensor:
    """exp(Δ A) (or 2 exp(Δ A) - 1 with ``neg_eigval``) of Δ [..., D] -> [..., D, N]."""
    decay = torch.exp(dt.unsqueeze(-1) * A)
    return 2 * decay - 1 if neg_eigval else decay


def scan_with_states(
    u: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    keep: bool,
    initial: torch.Tensor | None = None,
    replace_first: bool = False,
    neg_eigval: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Time-major scan: u = Δx, dt = Δ [T, batch, D]; B, C [T, batch, N] -> y [T, batch, D]
    and, with ``keep``, every state and decay [T, batch, D, N] for the backward pass.
    ``initial`` [batch, D, N]: the state before the first step, or with ``replace_first`` the
    state after it (the first step's update is skipped). ``neg_eigval``: the decays are
    2 exp(Δ A) - 1.

    Without ``keep`` on a CPU the rows go through in blocks whose state fits a core's cache
    (:data:`CACHE_BLOCK` elements), each step's decay made as the step needs it: a whole
    [batch, D, N] state is several MB at an intervention's batch, and each step's passes over
    it (and over a decay computed for every step beforehand) then come from memory. Every
    operation is elementwise or a sum over N within a row, so the blocks give the same bits
    (tests/test_selective_scan.py)."""
    if not keep and u.device.type == "cpu":
        y = u.new_empty(u.shape)
        stepwise = A.numel() % WHOLE_VECTORS == 0
        for rows in _row_blocks(u, A):
            first = None if initial is None else initial[rows]
            y[:, rows] = _scan_rows(
                u[:, rows],
                dt[:, rows],
                A,
                B[:, rows],
                C[:, rows],
                first,
                replace_first,
                neg_eigval,
                stepwise,
            )
        return (y,)
    decay = _decays(dt, A, neg_eigval)
    if replace_first:
        h = initial
    else:
        h = u[0].unsqueeze(-1) * B[0].unsqueeze(-2)
        if initial is not None:
            h = torch.addcmul(h, decay[0], initial)
    states, ys = [h], [(h * C[0].unsqueeze(-2)).sum(-1)]
    for t in range(1, u.shape[0]):
        h = torch.addcmul(u[t].unsqueeze(-1) * B[t].unsqueeze(-2), decay[t], h)
        if keep:
            states.append(h)
        ys.append((h * C[t].unsqueeze(-2)).sum(-1))
    if not keep:
        return (torch.stack(ys),)
    return torch.stack(ys), torch.stack(states), decay


def _scan_rows(
    u: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial: torch.Tensor | None,
    replace_first: bool,
    neg_eigval: bool,
    stepwise: bool,
) -> torch.Tensor:
    """:func:`scan_with_states`' readout of one block of rows, without kept states; its
    decays one step at a time where ``stepwise`` (:data:`WHOLE_VECTORS`), else all at once."""
    decays = None if stepwise else _decays(dt, A, neg_eigval)

    def decay(t: int) -> torch.Tensor:
        return _decays(dt[t], A, neg_eigval) if decays is None else decays[t]

    if replace_first:
        h = initial
    else:
        h = u[0].unsqueeze(-1) * B[0].unsqueeze(-2)
        if initial is not None:
            h = torch.addcmul(h, decay(0), initial)
    y = u.new_empty(u.shape)
    y[0] = (h * C[0].unsqueeze(-2)).sum(-1)
    for t in range(1, u.shape[0]):
        h = torch.addcmul(u[t].unsqueeze(-1) * B[t].unsqueeze(-2), decay(t), h)
        y[t] = (h * C[t].unsqueeze(-2)).sum(-1)
    return y


def scan_states(
    u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, neg_eigval: bool = False
) -> torch.Tensor:
    """Every state of :func:`scan_with_states` from a zero state, [T, batch, D, N] (u, dt
    [T, batch, D]; B [T, batch, N]), without the readout or the decays: what an intervention
    resumes from. Written straight into the result, a block of rows at a time on a CPU (as a
    scan without kept states), the same bits as ``scan_with_states(..., keep=True)[1]``."""
    states = u.new_empty(*u.shape, A.shape[1])
    cpu = u.device.type == "cpu"
    stepwise = cpu and A.numel() % WHOLE_VECTORS == 0
    for rows in _row_blocks(u, A) if cpu else [slice(None)]:
        ur, dtr, br = u[:, rows], dt[:, rows], B[:, rows]
        decays = None if stepwise else _decays(dtr, A, neg_eigval)
        h = ur[0].unsqueeze(-1) * br[0].unsqueeze(-2)
        states[0, rows] = h
        for t in range(1, u.shape[0]):
            decay = _decays(dtr[t], A, neg_eigval) if decays is None else decays[t]
            h = torch.addcmul(ur[t].unsqueeze(-1) * br[t].unsqueeze(-2), decay, h)
            states[t, rows] = h
    return states


class _SelectiveScan(torch.autograd.Function):
    """The selective scan without D, time-major, with a hand-written backward.

    Forward: ``h_t = exp(Δ_t A) h_{t-1} + u_t B_t`` (u = Δx), ``y_t = h_t C_t``. Backward walks
    time in reverse with the adjoint ``g_t = dy_t C_t + exp(Δ_{t+1} A) g_{t+1}``, from which
    ``du_t = g_t B_t``, ``dB_t = u_t g_t`` (summed over channels), ``dC_t = dy_t h_t``, and the
    decay's log-gradient ``g_t exp(Δ_t A) h_{t-1}`` gives dΔ (times A) and dA (times Δ). With
    ``neg_eigval`` (a non-tensor input) the decay a_t = 2 exp(Δ_t A) - 1 carries the adjoint and
    its derivative in Δ_t A, 2 exp(Δ_t A) = a_t + 1, takes exp(Δ_t A)'s place in that term.
    Returns (y, states, decays); the last two are saved for the backward and carry no
    gradient. ``generate_vmap_rule`` keeps it usable under torch.func (stacked training).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(u, dt, A, B, C, neg_eigval=False):  # type: ignore[override]
        return scan_with_states(u, dt, A, B, C, keep=True, neg_eigval=neg_eigval)

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple
    ) -> None:
        ctx.save_for_backward(*inputs[:5], output[1], output[2])
        ctx.neg_eigval = len(inputs) > 5 and inputs[5]
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, gy, _states, _decays):  # type: ignore[override]
        u, dt, A, B, C, H, decay = ctx.saved_tensors
        length = u.shape[0]
        du, dd, dB, dC = ([None] * length for _ in range(4))
        g = dA = None
        for t in range(length - 1, -1, -1):
            gy_t, c_t = gy[t].unsqueeze(-1), C[t].unsqueeze(-2)
            g = gy_t * c_t if g is None else torch.addcmul(g, gy_t, c_t)
            dC[t] = (gy_t * H[t]).sum(-2)
            du[t] = (g * B[t].unsqueeze(-2)).sum(-1)
            dB[t] = (g * u[t].unsqueeze(-1)).sum(-2)
            if t == 0:  # the first state has no predecessor to decay
                dd[t] = torch.zeros_like(dt[0])
                break
            g_decayed = g * decay[t]
            # d decay / d(Δ A): exp(Δ A) = decay, or 2 exp(Δ A) = decay + 1 with neg_eigval
            dlog = g * (decay[t] + 1) * H[t - 1] if ctx.neg_eigval else g_decayed * H[t - 1]
            dd[t] = (dlog * A).sum(-1)
            dt_t = dt[t].unsqueeze(-1)
            dA = dlog * dt_t if dA is None else torch.addcmul(dA, dlog, dt_t)
            g = g_decayed
        dA = torch.zeros_like(A) if dA is None else dA.sum(0)
        grads = torch.stack(du), torch.stack(dd), dA, torch.stack(dB), torch.stack(dC)
        return (*grads, None) if len(ctx.needs_input_grad) > 5 else grads
