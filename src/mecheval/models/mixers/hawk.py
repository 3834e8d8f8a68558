"""Hawk (De et al., 2024): Griffin's recurrent block with the RG-LRU, following
google-deepmind/recurrentgemma's PyTorch code, ``recurrentgemma/torch/modules.py``
(``RecurrentBlock``) and ``recurrentgemma/torch/layers.py`` (``RGLRU``, ``BlockDiagonalLinear``,
``Conv1D``, ``rnn_scan``, ``rnn_param_init``, ``SqrtBoundDerivative``):

    y      = GeLU(linear_y x)                   d -> lru_width, tanh-approximate GeLU (as JAX)
    u      = conv(linear_x x)                   d -> lru_width, then a causal depthwise
                                                temporal conv of width 4 with bias, no activation
    r_t    = σ(a_gate u_t),  i_t = σ(input_gate u_t)   block-diagonal weights (num_heads blocks)
                                                       with bias
    log a_t = -c · softplus(Λ) ⊙ r_t            c = 8
    h_t    = a_t ⊙ h_{t-1} + sqrt(1 - a_t²) ⊙ (i_t ⊙ u_t)
    out    = linear_out(h ⊙ y)                  lru_width -> d

Reset at the document start, as the reference does at ``segment_pos == 0``: the first step is
h_0 = i_0 ⊙ u_0, without the sqrt(1 - a²) normalisation (and a_0 multiplies the zero state).
Every sequence here is one document starting at position 0. The square root's gradient is
clipped as the reference's ``SqrtBoundDerivative`` (at 1000, i.e. for 1 - a² < 2.5e-7).

Init as the reference, for what is the RG-LRU's own (the backbone initialises the Linears):

* Λ (``rg_lru.a_param``): ``rnn_param_init(min_rad=0.9, max_rad=0.999)``: a radius r with r²
  uniform in [0.81 + 1e-8, 0.998 + 1e-8] ("proportional to area in a ring"), Λ = softplus⁻¹(-log r),
  so that exp(-softplus(Λ)) = r ∈ [0.9, 0.999]. (The paper's text says a^c uniform in
  [0.9, 0.999]; the code, followed here, puts a = exp(-softplus(Λ)) — the decay at r_t = 1/c —
  in [0.9, 0.999] with a² uniform: the full decay a^c = exp(-c softplus(Λ)) is in
  [0.9^8, 0.999^8] = [0.43, 0.992].)
* gate weights N(0, 1 / block width), biases 0 (``BlockDiagonalLinear``, variance scale 1);
* conv weights N(0, 0.01 / width), bias 0 (``Conv1D``, variance scale 0.01).

Defaults: ``lru_width`` None = d_model (the reference's ``lru_width or width``); ``num_heads``
1: the reference keeps the gates' block width at 256 (RecurrentGemma 2B: width 2560, 10
heads; 9B: 4096, 16), which at the widths used here (d_model <= 256) is one block;
``num_heads: 4`` gives four blocks. ``conv_size`` 4 (``conv1d_temporal_width``).

Deliberate differences from the reference:

* the block around the mixer is the shared backbone's (pre-LayerNorm, GELU MLP with expansion
  4, zoology's init of the Linears: N(0, init_std), biases 0), not Griffin's residual block
  (RMSNorm, gated GeLU MLP with expansion 3, LeCun-normal Linears); Griffin's block does have an
  MLP, so ``mlp=True``. ``linear_out`` keeps the reference's name, so zoology's init leaves it
  at N(0, init_std) (the reference scales it by ``final_w_init_variance_scale``);
* the temporal conv is :class:`~mecheval.models.mixers.base.ShortConv` (weight [C, 1, k],
  tap k-1 = the current step; the reference's ``Conv1D.w`` is [k, C] in the same tap order),
  so that its output is the site ``mixer.conv.output``; the reference's document masks inside
  the conv are not needed with one document per sequence;
* 1 - a² is computed as -expm1(2 log a) (the reference: 1 - exp(2 log a)); the same function,
  without the cancellation near a = 1;
* everything runs in the model's dtype (the reference accumulates the scan in float32).

The forward pass uses :func:`rglru_scan`, the step loop as one autograd node with a
hand-written adjoint recurrence (one fused multiply-add per step each way). At the paper's
shape (d 64, B 32, T 35, one thread) it made the mixer's forward + backward ~9x faster than
:func:`rglru_scan_chunked`, the chunked scan by segment sums of log-decays (every exponent
<= 0), whose pairwise decays are [B, T, chunk, W] elementwise tensors with no matmul to carry
them; that form is kept as a second, tested implementation (``chunk_size`` is its block
length). :func:`rglru_scan_recurrent` is the reference's ``rnn_scan``, one step at a time
(for tests and :meth:`Hawk.mix_recurrent`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from mecheval.models.mixers.base import Mixer, ShortConv, optional_conv
from mecheval.models.mixers.decay import segment_sums_per_channel

#: The reference clips the gradient of sqrt at this value (``_MAX_SQRT_GRADIENT``).
MAX_SQRT_GRADIENT = 1000.0


class HawkOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lru_width: int | None = Field(
        None, ge=1, le=65536, description="width of the recurrence; null = d_model"
    )
    num_heads: int = Field(1, ge=1, le=4096, description="diagonal blocks of the RG-LRU gates")
    conv_size: int | None = Field(
        4, ge=1, le=64, description="width of the temporal conv (null: none)"
    )
    c: float = Field(8.0, gt=0.0, le=1e3, description="log a_t = -c softplus(Λ) r_t")
    min_rad: float = Field(0.9, gt=0.0, lt=1.0, description="Λ init: exp(-softplus(Λ)) >= this")
    max_rad: float = Field(0.999, gt=0.0, lt=1.0, description="... and <= this")
    chunk_size: int = Field(
        16, ge=1, le=4096, description="block length of rglru_scan_chunked (not the forward's)"
    )

    @model_validator(mode="after")
    def _radii(self) -> HawkOptions:
        if self.min_rad > self.max_rad:
            raise ValueError(
                f"min_rad={self.min_rad} must not exceed max_rad={self.max_rad} "
                "(model.mixer.min_rad, model.mixer.max_rad)"
            )
        return self


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
    (:func:`~mecheval.models.mixers.decay.segment_sums_per_channel`), free of the cancellation of a
    difference of two large cumulative sums. Memory O(T · chunk · W).
    """
    b, length, w = x.shape
    c = max(1, min(chunk_size, length))  # a sequence shorter than a chunk: one chunk
    n = -(-length // c)
    pad = n * c - length
    if pad:
        # Trailing zeros: a = 1 and no input; the padded steps come after every real one.
        log_a, x = F.pad(log_a, (0, 0, 0, pad)), F.pad(x, (0, 0, 0, pad))
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


def _scan_from(log_a: torch.Tensor, x: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """:func:`rglru_scan` from the state ``initial`` [B, W] before the first step (the scan
    itself starts from zero: the first step's input takes a_0 ⊙ initial)."""
    if log_a.shape[1] == 0:
        return x
    first = x[:, :1] + torch.exp(log_a[:, :1]) * initial[:, None]
    return rglru_scan(log_a, torch.cat([first, x[:, 1:]], dim=1))


def rg_lru_a_init(
    a_param: torch.Tensor, min_rad: float, max_rad: float, eps: float = 1e-8
) -> torch.Tensor:
    """The reference's ``rnn_param_init`` (in place): r with r² uniform in
    [min_rad² + eps, max_rad² + eps], then Λ = softplus⁻¹(-log r) = log(exp(-log r) - 1)."""
    with torch.no_grad():
        a_param.uniform_(min_rad**2 + eps, max_rad**2 + eps)
        log_r = 0.5 * torch.log(a_param)
        return a_param.copy_(torch.log(torch.expm1(-log_r)))


class BlockDiagonalLinear(nn.Module):
    """The reference's ``BlockDiagonalLinear``: ``num_blocks`` independent [bw, bw] Linears on
    consecutive slices of the width, with bias; weights N(0, 1 / bw), biases 0."""

    def __init__(self, width: int, num_blocks: int) -> None:
        super().__init__()
        self.num_blocks = num_blocks
        self.block_width = width // num_blocks
        self.w = nn.Parameter(torch.empty(num_blocks, self.block_width, self.block_width))
        self.b = nn.Parameter(torch.empty(num_blocks, self.block_width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.w, mean=0.0, std=math.sqrt(1.0 / self.block_width))
        nn.init.zeros_(self.b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, width = x.shape
        x = x.reshape(*lead, self.num_blocks, self.block_width)
        y = torch.einsum("...hi,hij->...hj", x, self.w) + self.b
        return y.reshape(*lead, width)


class RGLRU(nn.Module):
    """The RG-LRU's parameters and gates (the reference's ``RGLRU``); the scan is separate."""

    def __init__(self, width: int, options: HawkOptions) -> None:
        super().__init__()
        self.options = options
        self.a_param = nn.Parameter(torch.empty(width))
        self.input_gate = BlockDiagonalLinear(width, options.num_heads)
        self.a_gate = BlockDiagonalLinear(width, options.num_heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.input_gate.reset_parameters()
        self.a_gate.reset_parameters()
        rg_lru_a_init(self.a_param, self.options.min_rad, self.options.max_rad)

    def scan_inputs(
        self, x: torch.Tensor, at_start: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, W] -> (log a_t, the normalised, gated input) of h_t = a_t h_{t-1} + ...;
        ``at_start``: x's first position is the document's first (False for a window resumed
        after it)."""
        gate_x = torch.sigmoid(self.input_gate(x))
        gate_a = torch.sigmoid(self.a_gate(x))
        log_a = -self.options.c * gate_a * F.softplus(self.a_param)
        multiplier = sqrt_bound_derivative(-torch.expm1(2 * log_a))
        if at_start:
            # The reference's reset at the document start: h_0 = i_0 ⊙ x_0 (a_0 and the
            # normalisation are dropped there).
            multiplier = torch.cat([torch.ones_like(multiplier[:, :1]), multiplier[:, 1:]], 1)
            log_a = torch.cat([torch.zeros_like(log_a[:, :1]), log_a[:, 1:]], dim=1)
        return log_a, x * gate_x * multiplier


class Hawk(Mixer):
    def __init__(self, d_model: int, options: HawkOptions) -> None:
        super().__init__()
        self.options = options
        self.lru_width = options.lru_width or d_model
        if self.lru_width % options.num_heads:
            raise ValueError(
                f"model.mixer.num_heads: {options.num_heads} does not divide the RG-LRU width "
                f"{self.lru_width} (model.mixer.lru_width, null = model.d_model={d_model})"
            )
        self.linear_y = nn.Linear(d_model, self.lru_width)
        self.linear_x = nn.Linear(d_model, self.lru_width)
        self.conv = optional_conv(self.lru_width, options.conv_size, bias=True)
        self.rg_lru = RGLRU(self.lru_width, options)
        self.linear_out = nn.Linear(self.lru_width, d_model)
        self.init_special()

    @torch.no_grad()
    def init_special(self) -> None:
        # Conv1D: w ~ N(0, 0.01 / temporal width), b = 0; the RG-LRU's gates and Λ.
        if isinstance(self.conv, ShortConv):
            k = self.options.conv_size
            nn.init.normal_(self.conv.weight, mean=0.0, std=math.sqrt(0.01 / k))
            nn.init.zeros_(self.conv.bias)
        self.rg_lru.reset_parameters()

    def branches(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> (GeLU branch y, log a_t, scan input), each [B, T, lru_width]."""
        y = F.gelu(self.linear_y(x), approximate="tanh")
        log_a, drive = self.rg_lru.scan_inputs(self.conv(self.linear_x(x)))
        return y, log_a, drive

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.lru_width

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        y, log_a, drive = self.branches(x)
        h = rglru_scan(log_a, drive)
        return self.linear_out(h * y)

    # Resuming from a prefix (Mixer.prefix_states): the state is the RG-LRU's h after each
    # position, [B, T, lru_width]; the temporal conv reads conv_size - 1 inputs before the cut.
    def prefix_halo(self) -> int:
        return self.conv.kernel_size - 1 if isinstance(self.conv, ShortConv) else 0

    def prefix_states(self, x: torch.Tensor) -> torch.Tensor:
        _, log_a, drive = self.branches(x)
        return rglru_scan(log_a, drive)

    has_recurrent_state = True

    def mix_from(
        self, x: torch.Tensor, offset: int, state: torch.Tensor | None, replace: bool = False
    ) -> torch.Tensor:
        if state is None:  # no state: the window starts at the document's start
            return self.mix(x)[:, offset:]
        y = F.gelu(self.linear_y(x[:, offset:]), approximate="tanh")
        log_a, drive = self.rg_lru.scan_inputs(self.conv(self.linear_x(x))[:, offset:], False)
        if replace:
            # The state after the window's first position is given: its output reads it, the
            # rest of the window continues from it.
            rest = _scan_from(log_a[:, 1:], drive[:, 1:], state)
            h = torch.cat([state[:, None], rest], dim=1)
        else:
            h = _scan_from(log_a, drive, state)
        return self.linear_out(h * y)

    def mix_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step scan (for tests and debugging)."""
        y, log_a, drive = self.branches(x)
        return self.linear_out(rglru_scan_recurrent(log_a, drive) * y)
