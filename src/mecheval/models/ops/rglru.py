"""The RG-LRU (Hawk): its gates, log a_t = -c softplus(Λ) r_t and the normalised input
sqrt(1 - a_t²) (i_t ⊙ u_t) (:func:`rglru_inputs`), and its diagonal scan
h_t = a_t ⊙ h_{t-1} + x_t with log a_t given.

:func:`rglru_scan_recurrent` is the step-by-step reference (the reference's ``rnn_scan``, for
tests and ``Hawk.mix_recurrent``); :func:`rglru_scan` what the module runs: the step loop as
one autograd node with a hand-written adjoint recurrence (one fused multiply-add per step each
way). At the paper's shape (d 64, B 32, T 35, one thread) it made the mixer's forward +
backward ~9x faster than :func:`rglru_scan_chunked`, the chunked scan by segment sums of
log-decays (every exponent <= 0), whose pairwise decays are [B, T, chunk, W] elementwise
tensors with no matmul to carry them; that form is kept as a second, tested implementation
(Hawk's ``chunk_size`` is its block length).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mecheval.models.ops.decay import pad_steps, segment_sums_per_channel

#: The reference clips the gradient of sqrt at this value (``_MAX_SQRT_GRADIENT``).
MAX_SQRT_GRADIENT = 1000.0


class _SqrtBoundDerivative(torch.autograd.Function):
    """sqrt(x) whose gradient is clipped at ``MAX_SQRT_GRADIENT`` (the reference's
    ``SqrtBoundDerivative``: 1 / sqrt(max(4x, 1 / MAX²))). ``generate_vmap_rule`` keeps it
    usable under torch.func (stacked training)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.sqrt(x)

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor
    ) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad / torch.sqrt(torch.clamp(4.0 * x, min=1 / MAX_SQRT_GRADIENT**2))


def sqrt_bound_derivative(x: torch.Tensor) -> torch.Tensor:
    return _SqrtBoundDerivative.apply(x)


def rglru_inputs(
    x: torch.Tensor,
    gate_x: torch.Tensor,
    gate_a: torch.Tensor,
    a_param: torch.Tensor,
    c: float,
    at_start: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The RG-LRU's gate arithmetic: x and its gates i_t = gate_x, r_t = gate_a (after their
    sigmoid), [B, T, W], and Λ = ``a_param`` [W] -> (log a_t, the normalised, gated input) of
    h_t = a_t h_{t-1} + ...: log a_t = -c r_t softplus(Λ), input sqrt(1 - a_t²) (i_t ⊙ x_t),
    with 1 - a² computed as -expm1(2 log a) and the square root's gradient clipped as the
    reference's ``SqrtBoundDerivative`` (at 1000, i.e. for 1 - a² < 2.5e-7). ``at_start``:
    x's first position is the document's first (False for a window resumed after it), where
    the recurrence resets as the reference's does at ``segment_pos == 0``: h_0 = i_0 ⊙ x_0,
    without the sqrt(1 - a²) normalisation (a_0 multiplies the zero state)."""
    log_a = -c * gate_a * F.softplus(a_param)
    multiplier = sqrt_bound_derivative(-torch.expm1(2 * log_a))
    if at_start:
        multiplier = torch.cat([torch.ones_like(multiplier[:, :1]), multiplier[:, 1:]], 1)
        log_a = torch.cat([torch.zeros_like(log_a[:, :1]), log_a[:, 1:]], dim=1)
    return log_a, x * gate_x * multiplier


def rglru_scan_recurrent(log_a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """h_t = exp(log_a_t) ⊙ h_{t-1} + x_t from h_{-1} = 0, one step at a time (the reference's
    ``rnn_scan``). log_a, x: [B, T, W] -> every h_t, [B, T, W]."""
    h = x.new_zeros(x.shape[0], x.shape[2])
    outs = []
    for t in range(x.shape[1]):
        h = torch.exp(log_a[:, t]) * h + x[:, t]
        outs.append(h)
    return torch.stack(outs, dim=1)


def rglru_scan_chunked(log_a: torch.Tensor, x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The same function as :func:`rglru_scan_recurrent`, in chunks of ``chunk_size`` steps.

    Within a chunk that starts from h_in, with L_t = Σ_{r<=t} log a_r from the chunk's start:
        h_t = exp(L_t) h_in + Σ_{s<=t} exp(L_t - L_s) x_s,
    all steps of all chunks at once; only the hand-over of h between chunks is sequential.
    Every exponent is <= 0: L_t <= 0, and L_t - L_s is needed only for s <= t (the pairs s > t
    are masked before the exponential); it is summed directly, Σ_{s<r<=t} log a_r
    (:func:`~mecheval.models.ops.decay.segment_sums_per_channel`), free of the cancellation of a
    difference of two large cumulative sums. Memory O(T · chunk · W).
    """
    b, length, w = x.shape
    c = max(1, min(chunk_size, length))  # a sequence shorter than a chunk: one chunk
    n = -(-length // c)
    pad = n * c - length
    # Trailing zeros: a = 1 and no input; the padded steps come after every real one.
    log_a, x = pad_steps(pad, -2, log_a, x)
    log_a, x = log_a.reshape(b, n, c, w), x.reshape(b, n, c, w)
    cum = log_a.cumsum(dim=2)  # [B, n, c, W]: L_t, <= 0
    decay = torch.exp(
        segment_sums_per_channel(log_a)
    )  # [B, n, t, s, W]: exp(L_t - L_s), 0 for s > t
    intra = (decay * x[:, :, None, :, :]).sum(3)  # [B, n, c, W]
    carry = torch.exp(cum)  # decay of the incoming state to each step
    h = x.new_zeros(b, w)
    outs = []
    for i in range(n):
        chunk = intra[:, i] + carry[:, i] * h[:, None, :]
        outs.append(chunk)
        h = chunk[:, -1]
    return torch.cat(outs, dim=1)[:, :length]


class _DiagonalScan(torch.autograd.Function):
    """h_t = a_t ⊙ h_{t-1} + x_t along dim 0 from h_{-1} = 0 (a, x time-major [T, ...]);
    returns every h_t.

    One fused multiply-add per step forward, and one per step for the adjoint
    dh_t = g_t + a_{t+1} ⊙ dh_{t+1} backward, after which grad x_t = dh_t and
    grad a_t = dh_t ⊙ h_{t-1} are whole-tensor products. No exponent anywhere (a = exp(log a)
    is taken by the caller, log a <= 0), so nothing can overflow. ``generate_vmap_rule`` keeps
    it usable under torch.func (stacked training).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        h = x[0]
        states = [h]
        for t in range(1, x.shape[0]):
            h = torch.addcmul(x[t], a[t], h)
            states.append(h)
        return torch.stack(states)

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor
    ) -> None:
        ctx.save_for_backward(inputs[0], output)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a, h = ctx.saved_tensors  # type: ignore[attr-defined]
        d = grad[-1]
        adjoints = [d]
        for t in range(grad.shape[0] - 1, 0, -1):
            d = torch.addcmul(grad[t - 1], a[t], d)
            adjoints.append(d)
        adjoints.reverse()
        grad_x = torch.stack(adjoints)
        # a_0 multiplies h_{-1} = 0, so it gets no gradient.
        grad_a = torch.cat([torch.zeros_like(h[:1]), grad_x[1:] * h[:-1]])
        return grad_a, grad_x


def rglru_scan(log_a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The same function as :func:`rglru_scan_recurrent`, as one autograd node with a
    hand-written adjoint (:class:`_DiagonalScan`): the forward pass's scan. log_a, x:
    [B, T, W] -> every h_t, [B, T, W]."""
    a = torch.exp(log_a).transpose(0, 1)
    return _DiagonalScan.apply(a, x.transpose(0, 1)).transpose(0, 1)


def rglru_scan_from(
    log_a: torch.Tensor, x: torch.Tensor, initial: torch.Tensor, replace_first: bool = False
) -> torch.Tensor:
    """:func:`rglru_scan` from the state ``initial`` [B, W] before the first step (the scan
    itself starts from zero: the first step's input takes a_0 ⊙ initial), or with
    ``replace_first`` the state after it: the first step's output is ``initial``, the rest
    continue from it."""
    if replace_first:
        rest = rglru_scan_from(log_a[:, 1:], x[:, 1:], initial)
        return torch.cat([initial[:, None], rest], dim=1)
    if log_a.shape[1] == 0:
        return x
    first = x[:, :1] + torch.exp(log_a[:, :1]) * initial[:, None]
    return rglru_scan(log_a, torch.cat([first, x[:, 1:]], dim=1))
