"""The implicit (Hyena-style) filters that parametrise a causal long convolution, and the
layer that applies one: ``y[b, t, c] = sum_{s <= t} k[c, t - s] * u[b, s, c]`` plus a skip
(the convolution itself: :func:`~mecheval.models.ops.long_conv.causal_long_conv`).

Two implicit filters parametrise the kernel, each as the paper's code builds it:

* :class:`ImplicitFilter`, Hyena's ``Filter`` (Poli et al., 2023; zoology ``mixers/hyena.py``):
  complex-exponential positional features ``z(t)`` of size ``emb_dim`` -> MLP with ``sin``
  activations (one shared, trainable frequency vector) -> ``[L, C]``, multiplied by an
  exponential-decay window ``exp(-t |delta_c|)`` with per-channel decay rates;
* :class:`MLPFilter`, zoology's ``ImplicitLongConvolution`` (``mixers/convolution.py``, the
  long convolution of BaseConv and of Based's Fig. 4b ablation): the same positional
  features, fixed, -> Linear(emb_dim, 16) -> ReLU -> Linear(16, C) with bias; no window.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from mecheval.models.mixers.base import mark_inert
from mecheval.models.ops.long_conv import (
    causal_long_conv,
    decay_window,
    positional_features,
    window_decay_rates,
)
from mecheval.models.sites import Site


class Sin(nn.Module):
    """``sin(freq * x)`` with a trainable per-unit frequency (Hyena's periodic activation)."""

    def __init__(self, dim: int, frequency: float) -> None:
        super().__init__()
        self.frequency = frequency
        self.freq = nn.Parameter(torch.empty(1, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.freq, self.frequency)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.freq * x)


def _check_length(length: int, l_max: int) -> None:
    if length > l_max:
        raise ValueError(
            f"sequence length {length} exceeds model.mixer.l_max={l_max} "
            "(the implicit filter is defined on l_max positions)"
        )


class ImplicitFilter(nn.Module):
    """Hyena's ``Filter``: sine MLP over positional features -> kernel ``[C, L]`` for any
    ``L <= l_max``, modulated by an exponential-decay window."""

    def __init__(
        self,
        channels: int,
        l_max: int,
        order: int,
        emb_dim: int = 3,
        num_inner_mlps: int = 2,
        frequency: float = 1.0,
        learn_positions: bool = False,
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        target: float = 1e-2,
        shift: float = 0.0,
    ) -> None:
        super().__init__()
        self.l_max = l_max
        self.shift = shift
        z, t = positional_features(l_max, emb_dim)
        # zoology's Hyena registers z as a trainable parameter (its lr_pos_emb is not 0);
        # t and the decay rates are fixed.
        if learn_positions:
            self.z = nn.Parameter(z)
        else:
            self.register_buffer("z", z, persistent=False)
        self.register_buffer("t", t, persistent=False)
        deltas = window_decay_rates(channels, fast_decay_pct, slow_decay_pct, target)
        self.register_buffer("deltas", deltas, persistent=False)
        # One Sin module reused after every hidden layer: the original shares its frequency.
        act = Sin(order, frequency)
        layers: list[nn.Module] = [nn.Linear(emb_dim, order), act]
        for _ in range(num_inner_mlps):
            layers += [nn.Linear(order, order), act]
        layers.append(nn.Linear(order, channels, bias=False))
        self.mlp = nn.Sequential(*layers)

    def forward(self, length: int) -> torch.Tensor:
        _check_length(length, self.l_max)
        h = self.mlp(self.z[:, :length])  # [1, L, C]
        h = h * decay_window(self.t[:, :length], self.deltas, self.shift)
        return h[0].transpose(0, 1)  # [C, L]

    def reset_special(self) -> None:
        """Init of what the backbone's generic Linear init does not touch: the positional
        features (when trained) and the sine frequencies."""
        if isinstance(self.z, nn.Parameter):
            z, _ = positional_features(self.l_max, self.z.shape[-1])
            with torch.no_grad():
                self.z.copy_(z)
        for module in self.mlp:
            if isinstance(module, Sin):
                module.reset_parameters()


class MLPFilter(nn.Module):
    """zoology's ``ImplicitLongConvolution`` filter: fixed positional features -> Linear ->
    ReLU -> Linear (with bias) -> kernel ``[C, L]`` for any ``L <= l_max``."""

    def __init__(self, channels: int, l_max: int, hidden: int = 16, emb_dim: int = 3) -> None:
        super().__init__()
        self.l_max = l_max
        z, _ = positional_features(l_max, emb_dim)
        # zoology stores z as a frozen nn.Parameter; a buffer is the same fixed input and
        # keeps the count of trained parameters equal to the reference's.
        self.register_buffer("z", z, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(emb_dim, hidden), nn.ReLU(), nn.Linear(hidden, channels))

    def forward(self, length: int) -> torch.Tensor:
        _check_length(length, self.l_max)
        return self.mlp(self.z[:, :length])[0].transpose(0, 1)  # [C, L]

    def reset_special(self) -> None:
        """Nothing beyond the backbone's Linear init (zoology's ``_init_weights`` reaches
        these Linears too: N(0, init_std) weights, zero biases)."""


class ImplicitLongConv(nn.Module):
    """``y = k * u + skip(u)`` with ``k`` from an implicit filter; ``[B, T, C]`` in/out.

    ``skip="identity"`` adds ``u`` (zoology's ``ImplicitLongConvolution``, whose ``fft_conv``
    adds ``u`` unweighted); ``skip="learned"`` adds ``D * u`` with a per-channel
    ``D ~ N(0, 1)`` (the Hyena ``Filter`` bias); ``skip="zeroed"`` keeps that ``D`` but
    multiplies it by 0, as zoology's ``Filter(bias=False)`` does in the paper's runs (its
    gradient is 0; it is kept so that parameter counts and state dicts match the reference).
    Its ``output`` site makes ``mixer.conv.output`` (or ``mixer.long_conv.output``)
    addressable.
    """

    def __init__(
        self,
        filter: ImplicitFilter | MLPFilter,
        skip: Literal["identity", "learned", "zeroed"] = "identity",
    ) -> None:
        super().__init__()
        self.filter = filter
        self.skip = skip
        channels = filter.mlp[-1].out_features
        self.D = nn.Parameter(torch.empty(channels)) if skip != "identity" else None
        if skip == "zeroed":
            mark_inert(self.D)
        self.output = Site()
        self.reset_special()

    def reset_special(self) -> None:
        """Init of what the backbone's generic Linear/Embedding init does not touch."""
        self.filter.reset_special()
        if self.D is not None:
            nn.init.normal_(self.D)

    def kernel(self, length: int) -> torch.Tensor:
        return self.filter(length)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.forward_from(u, 0)

    def forward_from(self, u: torch.Tensor, start: int) -> torch.Tensor:
        """:meth:`forward` at positions ``start``.. of ``u`` [R, T, C], the input's whole
        history: [R, T - start, C] (a mixer resumed from a prefix, interventions/prefix.py)."""
        y = causal_long_conv(u, self.kernel(u.shape[1]), start)
        u = u[:, start:]
        if self.D is None:
            y = y + u
        else:
            y = y + u * (self.D if self.skip == "learned" else self.D * 0.0)
        return self.output(y)
