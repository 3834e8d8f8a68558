"""Gated linear attention's recurrence: S_t = diag(α_t) S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ q_t.

:func:`gla_recurrent` is the step-by-step reference; :func:`gla_chunked` the chunked form the
module runs, as fla's ``ops/gla`` (``naive`` and ``chunk``).
"""

from __future__ import annotations

import math

import torch

from mecheval.models.ops.decay import balanced_chunks, pad_steps
from mecheval.models.ops.steps import run_steps


def gla_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial: torch.Tensor | None = None,
    keep: bool = False,
    replace_first: bool = False,
):
    """The GLA recurrence one step at a time (fla's ``naive_recurrent_gla``, without its scale).

    q, k, g: [B, H, T, d_k] (g: log-gates, <= 0); v: [B, H, T, d_v] -> o: [B, H, T, d_v].
    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ and o_t = q_tᵀ S_t; q is used as given.
    ``initial`` [B, H, d_k, d_v]: the state before the first step, or with ``replace_first``
    after it (its update skipped); with ``keep`` also every state after each step,
    [B, T, H, d_k, d_v] (resuming from a prefix: ``Mixer.final_states``).
    """
    b, h, length, d_k = k.shape
    state = k.new_zeros(b, h, d_k, v.shape[-1]) if initial is None else initial

    def update(t: int, state: torch.Tensor) -> torch.Tensor:
        decayed = torch.exp(g[:, :, t, :, None]) * state
        return decayed + k[:, :, t, :, None] * v[:, :, t, None]

    def read(t: int, state: torch.Tensor) -> torch.Tensor:
        return (q[:, :, t, :, None] * state).sum(-2)

    return run_steps(length, state, update, read, 2, keep, replace_first)


def _span_masks(
    m: int, e: int, with_state: bool, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, list[int]]:
    """0/1 rows R [rows, c] (c = m e steps of a chunk, sub-chunks of e) such that R @ g sums
    g_r over the spans :func:`gla_chunked` needs, each span on its own (no differences of
    running sums): per sub-chunk j and key s, s < r < j e (key s to the sub-chunk's start);
    per sub-chunk and pair (t, s) in it, s < r <= t; per step t, its sub-chunk's start <= r
    <= t (the sub-chunk's start to the query); with ``with_state`` also per step s, r > s
    (to the chunk's end) and, per step t, r <= t (the chunk's start to t). Returns the
    stacked rows and their group sizes."""
    c = m * e
    r = torch.arange(c, device=device)
    start = (r // e) * e  # each step's sub-chunk start
    sub_starts = torch.arange(m, device=device) * e
    to_sub = (r[None, :, None] < r[None, None, :]) & (r[None, None, :] < sub_starts[:, None, None])
    local = r.view(m, e)  # [m, e]: the steps of each sub-chunk
    pair = (local[:, None, :, None] < r) & (r <= local[:, :, None, None])  # [m, t, s, r]
    from_sub = (start[:, None] <= r[None, :]) & (r[None, :] <= r[:, None])
    groups = [to_sub.reshape(m * c, c), pair.reshape(m * e * e, c), from_sub]
    if with_state:
        groups += [r[None, :] > r[:, None], r[None, :] <= r[:, None]]
    return torch.cat(groups).to(dtype), [x.shape[0] for x in groups]


def gla_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    chunk_size: int,
    sub_chunk_size: int | None = None,
) -> torch.Tensor:
    """The same function as :func:`gla_recurrent`, in chunks of at most ``chunk_size`` steps
    (:func:`~mecheval.models.ops.decay.balanced_chunks`), each cut into sub-chunks of
    about ``sub_chunk_size`` steps (None: about the square root of the chunk length).

    Within a chunk that starts from the state S_0, with the log-gates summed over spans
    (per key channel):
        o_t = (q_t ⊙ exp(Σ_{r<=t} g_r))ᵀ S_0 + Σ_{s<=t} (Σ_j q_tj k_sj exp(Σ_{s<r<=t} g_rj)) v_s
    and the next chunk starts from diag(exp(Σ_r g_r)) S_0 + Σ_s (k_s ⊙ exp(Σ_{r>s} g_r)) v_sᵀ.
    The scores within the chunk are a [c, c] matrix per head, then one matmul with V:
    * a key s before the query's sub-chunk (starting at p) splits the decay at p:
      exp(Σ_{s<r<p} g) ⊙ exp(Σ_{p<=r<=t} g), a key factor per (sub-chunk, key) and a query
      factor per query, so those scores are matmuls (fla's secondary chunking);
    * a key in the query's own sub-chunk takes the per-channel pairwise decay, a
      [e, e, d_k] tensor per sub-chunk.
    Every exponent is a sum of log-gates (<= 0) over a span, summed on its own as a 0/1
    matrix product with g (:func:`_span_masks`), never the difference of two running sums
    (which, with strong gates, would lose the small decays to cancellation in float32) and
    never negated, so nothing overflows however strong the gates; no division by a decay.
    Pairs above the diagonal are masked after the exponential of a finite (<= 0) exponent.
    """
    b, h, length, d_k = k.shape
    d_v = v.shape[-1]
    n, c = balanced_chunks(length, chunk_size)
    m, e = balanced_chunks(c, sub_chunk_size or math.isqrt(max(c - 1, 0)) + 1)
    c = m * e
    pad = n * c - length
    # Trailing zeros: g = 0 keeps the state, k = 0 writes nothing; the outputs are dropped.
    q, k, v, g = pad_steps(pad, -2, q, k, v, g)
    q, k, v, g = (x.reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v, g))
    rows, sizes = _span_masks(m, e, n > 1, g.device, g.dtype)
    # Every span sum (<= 0) as one matmul, time on the rows and all else on the columns (a
    # batched matmul with d_k columns would be thin and slow), then back to [b, h, n, rows, d_k].
    spans = rows @ g.permute(3, 0, 1, 2, 4).reshape(c, -1)
    spans = spans.view(-1, b, h, n, d_k).permute(1, 2, 3, 0, 4).split(sizes, dim=3)
    to_sub, pair, from_sub = spans[:3]

    # Keys before the query's sub-chunk: matmuls of decayed queries and keys.
    k_sub = k[:, :, :, None] * to_sub.unflatten(3, (m, c)).exp()  # [b, h, n, m, c, d_k]
    q_sub = (q * from_sub.exp()).view(b, h, n, m, e, d_k)
    sub_starts = torch.arange(m, device=g.device) * e
    before = torch.arange(c, device=g.device) < sub_starts[:, None, None]  # [m, 1, c]
    inter = (q_sub @ k_sub.transpose(-1, -2)) * before  # [b, h, n, m, e, c]
    # Keys in the query's own sub-chunk: per-channel pairwise decays (0 above the diagonal).
    causal = torch.ones(e, e, dtype=torch.bool, device=g.device).tril()[..., None]
    decay = pair.unflatten(3, (m, e, e)).exp() * causal
    qs, ks = q.view(b, h, n, m, e, 1, d_k), k.view(b, h, n, m, 1, e, d_k)
    intra = (qs * decay * ks).sum(-1)  # [b, h, n, m, e, e]
    eye = torch.eye(m, dtype=g.dtype, device=g.device)[:, None, :, None]
    scores = inter.view(b, h, n, m, e, m, e) + intra[..., None, :] * eye
    out = scores.view(b, h, n, c, c) @ v  # [b, h, n, c, d_v]
    if n == 1:
        return out.view(b, h, c, d_v)[:, :, :length]

    to_end, from_start = spans[3:]
    q_in = q * from_start.exp()  # reads the chunk's incoming state
    k_out = (k * to_end.exp()).transpose(-1, -2)  # writes, decayed to the chunk's end
    carry = from_start[..., -1, :].exp()[..., None]  # [b, h, n, d_k, 1]
    state = k_out[:, :, 0] @ v[:, :, 0]
    outs = [out[:, :, 0]]
    for i in range(1, n):
        outs.append(out[:, :, i] + q_in[:, :, i] @ state)
        if i < n - 1:
            state = carry[:, :, i] * state + k_out[:, :, i] @ v[:, :, i]
    return torch.stack(outs, dim=2).reshape(b, h, n * c, d_v)[:, :, :length]
