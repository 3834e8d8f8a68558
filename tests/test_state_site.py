"""The recurrent-state site ``layers.{i}.mixer.state``: the engine's restore of a mixer's
state equals a forward written here from the recurrences' definitions, with the state
swapped by hand; bad names fail with a one-line error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mecheval.interventions import interchange
from mecheval.models import ModelConfig, build_model
from mecheval.models.sites import state_site_names
from mecheval.tasks import ARConfig, build_datasets, corrupt

TASK = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=6, n_test=0)


def model_for(arch: str, n_layers: int = 2):
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=16, n_layers=n_layers, vocab_size=TASK.vocab_size(), max_len=16
    )
    return build_model(cfg).double().eval()


def mixer_with_swap(mixer, u: torch.Tensor, at: int, swap: torch.Tensor | None):
    """(output, state after ``at``) of one document's mixer [1, T, d], by its recurrence
    step by step; with ``swap`` the state after ``at`` is replaced by it."""
    length = u.shape[1]
    if hasattr(mixer, "ssm_inputs"):  # Mamba: h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t
        xs, delta, b, c, z = mixer.ssm_inputs(u)
        h = torch.zeros(1, mixer.d_inner, mixer.d_state, dtype=u.dtype)
        ys = []
        for t in range(length):
            dt = delta[:, t, :, None]
            h = torch.exp(dt * mixer.A()) * h + dt * b[:, t, None, :] * xs[:, t, :, None]
            if t == at:
                kept = h
                h = h if swap is None else swap
            ys.append((h * c[:, t, None, :]).sum(-1) + mixer.D * xs[:, t])
        return mixer.out_proj(torch.stack(ys, 1) * F.silu(z)), kept
    if hasattr(mixer, "recurrence_inputs"):  # Mamba-3: the state is (h, k_{t-1}, x_{t-1}, Φ)
        (xs, log_a, dt, lam, steps, b, c), z = mixer.recurrence_inputs(u)
        heads, p, n, r = *xs.shape[2:], b.shape[-1], steps.shape[-1]

        def turn(v, phi):  # pairs (2j, 2j+1), j < r, as complex numbers times exp(i phi_j)
            w = torch.complex(v[..., 0 : 2 * r : 2], v[..., 1 : 2 * r : 2]) * torch.exp(1j * phi)
            return torch.cat([torch.stack([w.real, w.imag], -1).flatten(-2), v[..., 2 * r :]], -1)

        state = (
            torch.zeros(1, heads, p, n, dtype=u.dtype),
            torch.zeros(1, heads, n, dtype=u.dtype),
            torch.zeros(1, heads, p, dtype=u.dtype),
            torch.zeros(1, heads, r, dtype=u.dtype),
        )
        ys = []
        for t in range(length):
            h, k_prev, x_prev, phi = state
            phi = phi + steps[:, t]
            k, alpha = turn(b[:, t], phi), torch.exp(log_a[:, t])[..., None, None]
            beta = ((1 - lam[:, t]) * dt[:, t])[..., None, None] * alpha
            gamma = (lam[:, t] * dt[:, t])[..., None, None]
            h = alpha * h + beta * x_prev[..., None] * k_prev[..., None, :]
            h = h + gamma * xs[:, t, ..., None] * k[..., None, :]
            state = (h, k, xs[:, t], phi)
            if t == at:
                kept = state
                state = state if swap is None else swap
            h, phi = state[0], state[3]
            ys.append((h * turn(c[:, t], phi)[..., None, :]).sum(-1) + mixer.D[:, None] * xs[:, t])
        return mixer.finish(torch.stack(ys, 1), z), kept
    if hasattr(mixer, "rg_lru"):  # Hawk: h_t = a_t h_{t-1} + drive_t, from h_{-1} = 0
        y, log_a, drive = mixer.branches(u)
        h = torch.zeros(1, drive.shape[-1], dtype=u.dtype)
        hs = []
        for t in range(length):
            h = torch.exp(log_a[:, t]) * h + drive[:, t]
            if t == at:
                kept = h
                h = h if swap is None else swap
            hs.append(h)
        return mixer.linear_out(torch.stack(hs, 1) * y), kept
    if hasattr(mixer, "featurise"):  # Based: S_t = S_{t-1} + φ(k_t) v_tᵀ, z_t = z_{t-1} + φ(k_t)
        q, k, v = mixer.featurise(u)
        s = torch.zeros(1, q.shape[1], q.shape[-1], v.shape[-1], dtype=u.dtype)
        z = torch.zeros(1, q.shape[1], q.shape[-1], dtype=u.dtype)
        outs = []
        for t in range(length):
            s = s + k[:, :, t, :, None] * v[:, :, t, None, :]
            z = z + k[:, :, t]
            if t == at:
                kept = (s, z)
                s, z = (s, z) if swap is None else swap
            num = (q[:, :, t, :, None] * s).sum(-2)
            outs.append(num / ((q[:, :, t] * z).sum(-1, keepdim=True) + 1e-12))
        y = torch.stack(outs, 2).transpose(1, 2).reshape(1, length, -1)
        return mixer.proj_o(y), kept
    # DeltaNet: S_t = S_{t-1} + β_t (v_t - S_{t-1} k_t) k_tᵀ, o_t = S_t q_t
    q, k, v, beta = mixer.qkv_beta(u)
    state = torch.zeros(1, q.shape[1], v.shape[-1], k.shape[-1], dtype=u.dtype)
    outs = []
    for t in range(length):
        k_t = k[:, :, t]
        error = beta[:, :, t, None] * (v[:, :, t] - (state @ k_t[..., None])[..., 0])
        state = state + error[..., None] * k_t[..., None, :]
        if t == at:
            kept = state
            state = state if swap is None else swap
        outs.append((state @ q[:, :, t][..., None])[..., 0])
    return mixer.finish(torch.stack(outs, 2)), kept


def logits_with_swap(model, tokens, query: int, layer: int, at: int, swap):
    x = model.embed(tokens)
    kept = None
    for j, block in enumerate(model.layers):
        if j != layer:
            x = block(x)
            continue
        y, kept = mixer_with_swap(block.mixer, block.mixer_norm(x), at, swap)
        x = x + y
        if block.mlp is not None:
            x = x + block.mlp(block.mlp_norm(x))
    return model.head(x, torch.tensor([query])), kept


@pytest.mark.parametrize(
    ("arch", "layer"),
    [
        ("mamba", 0),
        ("mamba", 1),
        ("deltanet", 0),
        ("deltanet", 1),
        ("based", 1),
        ("hawk", 0),
        ("hawk", 1),
        ("mamba3", 0),
        ("mamba3", 1),
    ],
)
def test_restoring_the_state_equals_a_hand_written_swap(arch: str, layer: int) -> None:
    model = model_for(arch)
    if arch == "hawk":
        # At init its temporal conv (N(0, 0.01 / 4)) nearly mutes the key: make it carry.
        with torch.no_grad():
            for block in model.layers:
                block.mixer.conv.weight.normal_(
                    0.0, 1.0, generator=torch.Generator().manual_seed(4)
                )
    original = build_datasets(TASK)["dev"].batch(torch.arange(6))
    corrupted = corrupt(original, TASK, seed=3)
    site = f"layers.{layer}.mixer.state"
    assert site in state_site_names(model)
    roles = ["key", "value", "query"]
    result = interchange(model, original, corrupted, sites=[site], roles=roles)
    moved = 0
    with torch.no_grad():
        for doc in range(6):
            for role in roles:
                src, dst = int(original.roles[role][doc]), int(corrupted.roles[role][doc])
                query = int(corrupted.query[doc])
                _, source_state = logits_with_swap(
                    model, original.tokens[doc : doc + 1], query, layer, src, None
                )
                logits, _ = logits_with_swap(
                    model, corrupted.tokens[doc : doc + 1], query, layer, dst, source_state
                )
                expected = torch.softmax(logits, -1)[0, original.answer[doc]].item()
                row = result.per_example[
                    (result.per_example.doc == doc) & (result.per_example.role == role)
                ]
                assert row.restored.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
                moved += abs(expected - row.corrupted.item()) > 1e-6
    # The state at the key carries the corruption: restoring it must move some rows.
    assert moved >= 6


def test_a_state_site_of_a_mixer_without_one_is_a_clear_error() -> None:
    model = model_for("attention")
    original = build_datasets(TASK)["dev"].batch(torch.arange(2))
    corrupted = corrupt(original, TASK, seed=3)
    assert state_site_names(model) == []
    with pytest.raises(ValueError, match=r"^sites: 'layers.0.mixer.state' is not a state site"):
        interchange(model, original, corrupted, sites=["layers.0.mixer.state"])
