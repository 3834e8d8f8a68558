"""Models whose mechanism is known because their weights are set by hand: the label the
interventions read from them is known before they are read.

``induction_by_hand``: an induction circuit of two one-head attention layers on an AR-family
task, the classic one. The residual stream holds three blocks of one-hot coordinates: the
token (its embedding; the LM head is tied to it), the previous token, and the position. The
first attention layer (``copy``) attends from each position to the one before it and writes
that token into the previous-token block; the second (``read``) attends from the query to
the position whose previous token is the query's token, the value after the key's
occurrence, and writes that value's token, scaled up, into the token block, which the LM
head reads. Every other layer passes its input through: its mixer's output projection is
zero (mixers with an ``out_proj`` or ``o_proj``: attention, Mamba, Mamba-2, Mamba-3, Hyena,
DeltaNet, Gated DeltaNet, GLA, RetNet). So a model of layers ``[mamba, attention, attention]``
reads "induction in layer 2 (attention)", and ``[attention, attention, mamba]`` "induction in
layer 1 (attention)".

``attention_retrieves_by_hand``: one-head attention with the short convolution on its input
(``model.short_conv``) retrieves directly: the convolution gives each position the token
before it, and the attention matches the query's token against it, all inside one layer:
"direct retrieval, layer 0" with a pass-through layer after it.

``conv_induction_by_hand``: induction without attention. A BaseConv short convolution adds
each key to the position after it (the value's; a depthwise convolution keeps it on the
key's own channel), and a one-head DeltaNet or a Mamba layer that writes only where a value
stands binds the key and value it finds there, then reads the query's key: "induction in
layer 1 (deltanet)" for ``[baseconv, deltanet]``, "(mamba)" for ``[baseconv, mamba]``. A
Hyena layer binds them with its gate (a channel per pair) and sums the pairs with its long
convolution: induction by convolutions alone, "(hyena)" for ``[baseconv, hyena]``.

``direct_retrieval_by_hand``: one one-head DeltaNet layer whose short convolutions give its
key the previous token and its value and query the current one, with β = 1: it writes each
pair into its state, replacing what the key held, and reads the value at the query. Alone it
reads "direct retrieval, layer 0"; after a pass-through layer "direct retrieval in layer 1
(deltanet)"; on reassign AR its state holds the latest value before the query. A Mamba layer
does the same with one state column per key (B: the previous token is that key; C: this
token is), its state adding instead of replacing (no decay). A Hyena layer, a convolution,
does it with a channel per (key, value) pair: its gate x1 * v (this token a value, the one
before its key) binds the pair at the value, its long convolution sums what was bound, and
x2 reads the query's key's channels.

``parity_by_hand``: a Mamba or DeltaNet layer with negative eigenvalues allowed carries parity
in its state, set at <bos>, its sign flipped by every swap (a transition of exactly -1) and
kept by the identity (exactly 1), and writes it into the even and odd answer tokens. It reads
"in the state after it": the state at the query brings the answer back.

``candidates_by_hand``: one one-head attention layer that attends from every position evenly
to the value tokens before it, a BaseConv long convolution that counts each value seen so
far, a Mamba state column that adds up every token seen (its output passing the values'
channels alone), or a DeltaNet state that stores each value under its own key and is read
with one query that meets every value's key alike: at the query every value of the document
scores alike, the accuracy is the chance of a guess among them, "candidates only (no
binding)".

Layer norms are the reason for the scales: every position's residual holds the same number
of one-hot coordinates of the same size, so a block's norm maps every position alike, and
the dot products the heads compare differ only where the one-hot coordinates meet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mecheval.errors import ConfigError
from mecheval.models.backbone import LanguageModel
from mecheval.models.config import ModelConfig
from mecheval.models.mixers.attention import Attention
from mecheval.models.mixers.baseconv import BaseConv
from mecheval.models.mixers.deltanet import DeltaNet
from mecheval.models.mixers.hyena import Hyena
from mecheval.models.mixers.long_conv import ImplicitLongConv
from mecheval.models.mixers.mamba import Mamba
from mecheval.models.mixers.modules import ShortConv

#: The size of every one-hot coordinate the embedding writes.
EMBED = 4.0
#: The gain of the retrieved value's token over the query's own (the LM head's margin).
READ_GAIN = 12.0


def _layout(config: ModelConfig) -> tuple[int, int, int]:
    """(vocabulary, positions, d_model), checked to fit three one-hot blocks."""
    vocab, length, d = config.vocab_size, config.max_len, config.d_model
    if vocab is None or length is None:
        raise ConfigError("induction_by_hand: model.vocab_size and model.max_len must be set")
    if 2 * vocab + length > d:
        raise ConfigError(
            f"model.d_model: induction_by_hand needs 2 * vocab_size + max_len = "
            f"{2 * vocab + length} coordinates, got {d}"
        )
    return vocab, length, d


def _one_head_attention(model: LanguageModel, layer: int) -> Attention:
    mixer = model.layers[layer].mixer
    if not isinstance(mixer, Attention) or mixer.num_heads != 1:
        raise ConfigError(f"model.layers[{layer}]: induction_by_hand needs one-head attention")
    return mixer


def _pass_through(block: nn.Module, layer: int) -> None:
    """The block adds nothing: its mixer's output projection and its MLP's output are zero."""
    out = getattr(block.mixer, "out_proj", getattr(block.mixer, "o_proj", None))
    if not isinstance(out, nn.Linear):
        raise ConfigError(
            f"model.layers[{layer}]: a known model passes a layer through by zeroing its "
            f"mixer's out_proj or o_proj; {type(block.mixer).__name__} has neither"
        )
    out.weight.zero_()
    if out.bias is not None:
        out.bias.zero_()


def _blank(config: ModelConfig, keep: tuple[int, ...]) -> LanguageModel:
    """A model of ``config`` whose embedding writes one one-hot coordinate per token (and per
    position, where it has learned positions), whose norms are as built, whose MLPs add
    nothing and whose layers but ``keep`` pass their input through."""
    vocab, length, _ = _layout(config)
    model = LanguageModel(config)
    for module in model.modules():  # every norm as built: weight 1, bias 0
        if isinstance(module, nn.LayerNorm) or type(module).__name__ == "RMSNorm":
            module.weight.fill_(1.0)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
    tok = torch.arange(vocab)
    model.embedding.weight.zero_()
    model.embedding.weight[tok, tok] = EMBED
    if model.position is not None:
        model.position.weight.zero_()
        model.position.weight[torch.arange(length), 2 * vocab + torch.arange(length)] = EMBED
    for i, block in enumerate(model.layers):
        if block.mlp is not None:
            block.mlp.fc2.weight.zero_()
            block.mlp.fc2.bias.zero_()
        if i not in keep:
            _pass_through(block, i)
    return model


def _one_layer(config: ModelConfig, layer: int, builder: str) -> tuple[LanguageModel, int]:
    """:func:`_blank` keeping ``layer`` alone (checked to exist), and the vocabulary size."""
    vocab = _layout(config)[0]
    if not 0 <= layer < config.n_layers:
        raise ConfigError(f"{builder}: need 0 <= layer < {config.n_layers}")
    return _blank(config, (layer,)), vocab


def _normed_token(model: LanguageModel, layer: int) -> torch.Tensor:
    """What layer ``layer``'s norm makes of a position's residual: the same at every position
    (one one-hot token, and position, of the same size) but for which coordinate is hot, so
    its coordinate 0 is a hot one's value and coordinate 1 a cold one's."""
    residual = model.embedding.weight[0].clone()
    if model.position is not None:
        residual += model.position.weight[0]
    return model.layers[layer].mixer_norm(residual)


def induction_by_hand(config: ModelConfig, copy: int, read: int) -> LanguageModel:
    """A model of ``config`` (its ``layers``, learned positions on) whose layer ``copy``
    writes each position's previous token and whose layer ``read`` retrieves the value after
    the query's key (``copy`` < ``read``, both one-head attention); every other layer is
    passed through."""
    vocab, length, d = _layout(config)
    if not 0 <= copy < read < config.n_layers:
        raise ConfigError(f"induction_by_hand: need 0 <= copy < read < {config.n_layers}")
    if not config.position_embedding:
        raise ConfigError("model.position_embedding: induction_by_hand needs learned positions")
    with torch.no_grad():
        model = _blank(config, (copy, read))
        _copy_previous(_one_head_attention(model, copy), vocab, length, d)
        _read_after_match(_one_head_attention(model, read), vocab, d)
    return model


def attention_retrieves_by_hand(config: ModelConfig, layer: int) -> LanguageModel:
    """A model of ``config`` whose layer ``layer``, one-head attention with the short
    convolution on its input (``model.short_conv``), retrieves the value directly at the
    query: the embedding writes each token into the token block and the previous-token block
    alike, the convolution keeps the token block and shifts the previous-token block one
    step (each position then holds the token before it there), and the attention reads as
    the induction circuit's second layer does (:func:`_read_after_match`): the query's token
    against each position's previous token, the value after the key's occurrence written
    into the token block. No layer before it binds anything: the binding is made inside the
    layer, as a delta rule's is. Every other layer is passed through."""
    vocab, _, _ = _layout(config)
    if not 0 <= layer < config.n_layers:
        raise ConfigError(f"attention_retrieves_by_hand: need 0 <= layer < {config.n_layers}")
    with torch.no_grad():
        model = _blank(config, (layer,))
        attention = _one_head_attention(model, layer)
        conv = attention.short_conv
        if not (isinstance(conv, ShortConv) and conv.kernel_size >= 2):
            raise ConfigError(
                f"model.layers[{layer}]: attention_retrieves_by_hand needs the short "
                "convolution on the attention's input (model.short_conv >= 2)"
            )
        t = torch.arange(vocab)
        model.embedding.weight[t, vocab + t] = EMBED
        conv.weight.zero_()
        conv.weight[:, 0, conv.kernel_size - 1] = 1.0  # every channel: this position ...
        conv.weight[vocab + t, 0, conv.kernel_size - 1] = 0.0
        conv.weight[vocab + t, 0, conv.kernel_size - 2] = 1.0  # ... but the one before
        if conv.bias is not None:
            conv.bias.zero_()
        _read_after_match(attention, vocab, config.d_model)
    return model


#: The gain of the BaseConv copy layer's projection on the key channels: the previous key's
#: coordinate it writes, (hot - cold) times this, about the size of a token's own.
COPY_GAIN = 1.5


def conv_induction_by_hand(
    config: ModelConfig, copy: int, read: int, keys: Sequence[int], values: Sequence[int]
) -> LanguageModel:
    """Induction through a convolution: layer ``copy``, a BaseConv with a short convolution,
    adds to each position the previous token's coordinate where that token is a key (its
    convolution is depthwise, so the copy stays on the key's own channel of the token
    block); layer ``read``, a one-head DeltaNet or a Mamba layer, writes at each value's
    position the pair (the key coordinates there -> the value coordinates there) into its
    state, and reads it with the query's key (a Hyena layer: :func:`_hyena_binds`, the key
    read at the value's own position). The binding is made at the value, where the
    copy put the key beside it: the protocol's "induction", in the reading layer. ``keys``
    and ``values`` are the task's token ids. Every other layer is passed through."""
    if not 0 <= copy < read < config.n_layers:
        raise ConfigError(f"conv_induction_by_hand: need 0 <= copy < read < {config.n_layers}")
    with torch.no_grad():
        model = _blank(config, (copy, read))
        _baseconv_copies_keys(model, copy, list(keys))
        if isinstance(model.layers[read].mixer, Mamba):
            _mamba_binds(model, read, list(keys), list(values))
        elif isinstance(model.layers[read].mixer, Hyena):
            _hyena_binds(model, read, list(keys), list(values), key_lag=0)
        else:
            _deltanet_binds(model, read, list(keys), list(values))
    return model


def _baseconv_copies_keys(model: LanguageModel, layer: int, keys: list[int]) -> None:
    """BaseConv's weights for :func:`conv_induction_by_hand`: y = conv(u) * projection(u) + u
    with the short convolution's tap one step back on the key channels (its bias cancels
    what the norm leaves on a cold coordinate) and the projection a constant COPY_GAIN there,
    0 elsewhere."""
    mixer = model.layers[layer].mixer
    conv = getattr(mixer, "conv", None)
    if not (isinstance(mixer, BaseConv) and isinstance(conv, ShortConv) and conv.kernel_size >= 2):
        raise ConfigError(
            f"model.layers[{layer}]: conv_induction_by_hand copies with BaseConv's short "
            "convolution (kernel_size >= 2)"
        )
    normed = _normed_token(model, layer)
    cold = float(normed[1])
    k = torch.tensor(keys)
    conv.weight.zero_()
    conv.weight[k, 0, conv.kernel_size - 2] = 1.0
    conv.bias.zero_()
    conv.bias[k] = -cold
    mixer.projection.weight.zero_()
    mixer.projection.bias.zero_()
    mixer.projection.bias[k] = COPY_GAIN


def _deltanet_binds(model: LanguageModel, layer: int, keys: list[int], values: list[int]) -> None:
    """DeltaNet's weights for :func:`conv_induction_by_hand`: query and key read this
    position's key coordinates, the value its value coordinates (short convolutions at lag
    0), β = 1 at a value and 0 elsewhere; the read value is written into the token block
    READ_GAIN times over."""
    mixer = _one_head_deltanet(
        model,
        layer,
        "conv_induction_by_hand binds with one-head DeltaNet (with its short "
        "convolutions) or Mamba",
    )
    k, v = torch.tensor(keys), torch.tensor(values)
    _deltanet_reads(mixer, ((k, 0), (k, 0), (v, 0)))
    # β = sigmoid(large) = 1 where a value stands, sigmoid(very negative) = 0 elsewhere (the
    # value coordinates are all cold there): only a value position writes, so the query,
    # which is a key, reads what its pair wrote instead of overwriting it.
    mixer.b_proj.weight.zero_()
    mixer.b_proj.weight[:, v] = DELTA_SCALE * 4
    mixer.o_proj.weight.zero_()
    mixer.o_proj.weight[v, v] = READ_GAIN


#: The Mamba binding layer's Δ = softplus(BIND_DT_GAIN * v + BIND_DT_REST), v its value
#: channel there: large where a value stands (v near 1), about 2e-9 elsewhere (v = 0).
BIND_DT_GAIN = 40.0
BIND_DT_REST = -20.0


def _mamba_binds(model: LanguageModel, layer: int, keys: list[int], values: list[int]) -> None:
    """Mamba's weights for :func:`conv_induction_by_hand`: its channels x one-hot as for
    direct retrieval (this token's block only); B_n = C_n = 1 where key n's coordinate is
    hot at this position (its own token, or the key the convolution copied beside a value);
    Δ large where a value stands and about 0 elsewhere, so only a value's position writes,
    adding (key -> value) into that key's state column, which the query's C reads; the
    output projection passes the value channels alone."""
    mixer = model.layers[layer].mixer
    vocab = model.config.vocab_size
    _check_mamba_by_hand(mixer, layer, vocab, len(keys), "induction")
    x_one = _mamba_one_hot(model, layer, vocab)
    n, rank, state = torch.arange(len(keys)), mixer.dt_rank, mixer.d_state
    k, v = torch.tensor(keys), torch.tensor(values)
    mixer.x_proj.weight.zero_()
    mixer.x_proj.weight[0, v] = 1.0 / x_one  # Δ's input: 1 where a value stands
    mixer.x_proj.weight[rank + n, k] = 1.0 / x_one  # B
    mixer.x_proj.weight[rank + state + n, k] = 1.0 / x_one  # C
    mixer.dt_proj.weight.zero_()
    mixer.dt_proj.weight[:, 0] = BIND_DT_GAIN
    mixer.dt_proj.bias.fill_(BIND_DT_REST)
    mixer.A_log.fill_(-30.0)  # A = -exp(-30): exp(Δ A) is 1 in float32
    mixer.D.zero_()
    mixer.out_proj.weight.zero_()
    mixer.out_proj.weight[v, v] = READ_GAIN * EMBED / x_one


def _one_head_deltanet(model: LanguageModel, layer: int, needs: str) -> DeltaNet:
    """Layer ``layer``'s mixer, checked to be a one-head DeltaNet with its short
    convolutions (else one line: ``needs``)."""
    mixer = model.layers[layer].mixer
    if not (
        isinstance(mixer, DeltaNet)
        and mixer.num_heads == 1
        and getattr(mixer.k_conv, "kernel_size", 0) >= 2
    ):
        raise ConfigError(f"model.layers[{layer}]: {needs}")
    return mixer


def _deltanet_reads(mixer: DeltaNet, reads: Sequence[tuple[torch.Tensor, int]]) -> None:
    """DeltaNet's query, key and value, in that order, each (ids, lag): the projection passes
    the coordinates ``ids`` DELTA_SCALE times over, the short convolution the input ``lag``
    positions back."""
    for proj, conv, (ids, lag) in zip(
        (mixer.q_proj, mixer.k_proj, mixer.v_proj),
        (mixer.q_conv, mixer.k_conv, mixer.v_conv),
        reads,
        strict=True,
    ):
        proj.weight.zero_()
        proj.weight[ids, ids] = DELTA_SCALE
        conv.weight.zero_()
        conv.weight[:, 0, conv.kernel_size - 1 - lag] = 1.0
        if conv.bias is not None:
            conv.bias.zero_()


#: How far the DeltaNet layer's projections scale the normed one-hot token (SiLU then passes
#: it almost unchanged and all but zeroes the small negative rest).
DELTA_SCALE = 4.0


def direct_retrieval_by_hand(
    config: ModelConfig, layer: int, keys: Sequence[int] = (), values: Sequence[int] = ()
) -> LanguageModel:
    """A model of ``config`` whose layer ``layer`` retrieves the value directly at the query.
    A one-head DeltaNet with its 4-tap short convolutions writes at each position the pair
    (previous token -> this token) into its state (β = 1: the delta rule replaces what that
    key held), and at the query reads the state with the query's token. A Mamba layer (with
    its short conv) does the same with a state that adds instead of replacing: one state
    column per key token (``keys``, the task's key ids), into which each position writes its
    token when the previous token is that key, and which the query reads through C. A Hyena
    layer binds with its gate and sums with its long convolution (:func:`_hyena_binds`;
    ``values``: the task's value ids). Each writes the value's token into the token block
    READ_GAIN times over. Every other layer is passed through."""
    with torch.no_grad():
        model, vocab = _one_layer(config, layer, "direct_retrieval_by_hand")
        mixer = model.layers[layer].mixer
        if isinstance(mixer, Mamba):
            _mamba_retrieves(model, layer, vocab, list(keys))
            return model
        if isinstance(mixer, Hyena):
            _hyena_binds(model, layer, list(keys), list(values), key_lag=1)
            return model
        mixer = _one_head_deltanet(
            model,
            layer,
            "direct_retrieval_by_hand needs one-head DeltaNet, Mamba or Hyena, with a short "
            "convolution",
        )
        t = torch.arange(vocab)
        # the query's own token, the token before (the key), this token (the value)
        _deltanet_reads(mixer, ((t, 0), (t, 1), (t, 0)))
        mixer.b_proj.weight.zero_()
        mixer.b_proj.weight[:, t] = DELTA_SCALE * 4  # β = sigmoid(large) = 1 at every token
        mixer.o_proj.weight.zero_()
        mixer.o_proj.weight[t, t] = READ_GAIN
    return model


def _hyena_binds(
    model: LanguageModel, layer: int, keys: list[int], values: list[int], key_lag: int
) -> None:
    """Hyena's weights for :func:`direct_retrieval_by_hand` (``key_lag`` 1) and
    :func:`conv_induction_by_hand` (``key_lag`` 0), y = out_proj(x2 * LongConv(x1 * v)) with
    one channel per (key, value) pair: x1 is this position's value's coordinate on that
    value's channels, v (the short convolution ``key_lag`` steps back) a key's coordinate on
    that key's channels, the key before the value or the one a convolution copied beside it,
    so x1 * v is positive on the pair's channel where a value stands with its key and 0
    elsewhere; the long convolution's kernel is the same at every lag (its filter's sines at
    their peak, times the decay window, which stays near 1 over a document), so at the query
    it holds every pair seen; x2 opens the query's key's channels, and the output projection
    writes each channel's value into the token block. Each projection reads a coordinate
    less one that no token or position writes: exactly 0 where that token is absent,
    whatever else the position holds (the norm leaves every cold coordinate alike), and 1
    where it stands alone."""
    mixer = model.layers[layer].mixer
    conv, d = mixer.conv, mixer.d_model
    unused = _check_hyena_binds(model, layer, len(keys) * len(values))
    normed = _normed_token(model, layer)
    scale = 1.0 / float(normed[0] - normed[1])  # 1 / (hot - cold)

    def one_hot(token: int) -> torch.Tensor:
        row = torch.zeros(d)
        row[token], row[unused] = scale, -scale
        return row

    pairs = [(k, v) for k in keys for v in values]
    weight = mixer.in_proj.weight.zero_().view(3, d, -1)  # x1, x2, v
    mixer.in_proj.bias.zero_()
    for channel, (key, value) in enumerate(pairs):
        weight[0, channel] = one_hot(value)
        weight[1, channel] = weight[2, channel] = one_hot(key)
    conv.weight.zero_()
    conv.weight[: 2 * d, 0, conv.kernel_size - 1] = 1.0  # x1, x2: this position
    conv.weight[2 * d :, 0, conv.kernel_size - 1 - key_lag] = 1.0  # v: the key's
    if conv.bias is not None:
        conv.bias.zero_()
    _same_at_every_lag(mixer.long_conv.filter.mlp)
    mixer.out_proj.weight.zero_()
    mixer.out_proj.bias.zero_()
    for channel, (_, value) in enumerate(pairs):
        mixer.out_proj.weight[value, channel] = READ_GAIN * EMBED


def _check_hyena_binds(model: LanguageModel, layer: int, pairs: int) -> int:
    """That Hyena layer ``layer`` can bind ``pairs`` (key, value) pairs (its short
    convolution, a channel per pair); returns the coordinate no token or position writes."""
    mixer = model.layers[layer].mixer
    if not (isinstance(mixer.conv, ShortConv) and mixer.conv.kernel_size >= 2):
        raise ConfigError(f"model.layers[{layer}]: a binding Hyena needs its short convolution")
    if not 0 < pairs <= mixer.d_model:
        raise ConfigError(
            f"model.layers[{layer}]: a binding Hyena needs a channel per (key, value) pair: "
            f"{pairs} pairs of key and value ids within d_model ({mixer.d_model})"
        )
    vocab, length, _ = _layout(model.config)
    unused = vocab if model.position is None else 2 * vocab + length
    if unused >= model.config.d_model:
        raise ConfigError(
            f"model.d_model: a binding Hyena needs a coordinate no token or position writes "
            f"(more than {unused})"
        )
    return unused


def _same_at_every_lag(mlp: nn.Sequential) -> None:
    """Hyena's implicit filter made the same at every lag (before its decay window): every
    hidden Linear's weights 0 and bias pi / 2, the shared sines at frequency 1 (sin(pi / 2)
    = 1), the last Linear averaging those ones."""
    for module in mlp[:-1]:
        if isinstance(module, nn.Linear):
            module.weight.zero_()
            module.bias.fill_(math.pi / 2)
        else:  # the sines (one module, shared)
            module.freq.fill_(1.0)
    mlp[-1].weight.fill_(1.0 / mlp[-1].in_features)


#: softplus^-1(1): Δ = 1 at every position, so a state column adds what is written into it.
_DELTA_ONE = math.log(math.e - 1)
#: z with SiLU(z) = 1 (to four decimals): the output gate passes y unchanged.
_GATE_ONE = 1.2785


def _mamba_retrieves(model: LanguageModel, layer: int, vocab: int, keys: list[int]) -> None:
    """Mamba's weights for :func:`direct_retrieval_by_hand`. The channels of x: [0, vocab)
    this token, [vocab, 2 vocab) the previous one (the conv's taps), each exactly one-hot
    after the conv's bias cancels what the norm leaves on the other coordinates, times SiLU(1)
    after the SiLU. B_n = 1 where the previous token is key n, C_n = 1 where this token is;
    Δ = 1 and A ≈ 0 (no decay), D = 0; the gate z is SiLU's 1 at every position."""
    mixer = model.layers[layer].mixer
    _check_mamba_by_hand(mixer, layer, vocab, len(keys))
    t = torch.arange(vocab)
    x_one = _mamba_one_hot(model, layer, vocab)
    n, rank, state = torch.arange(len(keys)), mixer.dt_rank, mixer.d_state
    key_ids = torch.tensor(keys)
    mixer.x_proj.weight.zero_()
    mixer.x_proj.weight[rank + n, vocab + key_ids] = 1.0 / x_one  # B: previous token
    mixer.x_proj.weight[rank + state + n, key_ids] = 1.0 / x_one  # C: this token
    _mamba_adds(mixer)
    mixer.out_proj.weight[t, t] = READ_GAIN * EMBED / x_one


def _mamba_adds(mixer: Mamba) -> None:
    """Δ = 1 at every position and A ≈ 0, D = 0: each state column adds what is written into
    it, without decay; the output projection zeroed, for the caller to open."""
    mixer.dt_proj.weight.zero_()
    mixer.dt_proj.bias.fill_(_DELTA_ONE)
    mixer.A_log.fill_(-30.0)  # A = -exp(-30): exp(Δ A) is 1 in float32
    mixer.D.zero_()
    mixer.out_proj.weight.zero_()


#: The Mamba parity layer's A = -PARITY_DECAY: exp(Δ A) at Δ = 1 is 0 in float32, so the
#: transition 2 exp(Δ A) - 1 is exactly -1; at Δ = softplus(PARITY_REST) (about 4e-18) it
#: is exactly 1.
PARITY_DECAY = 200.0
PARITY_REST = -40.0


def parity_by_hand(
    config: ModelConfig, layer: int, bos: int, elements: tuple[int, int], states: tuple[int, int]
) -> LanguageModel:
    """A model of ``config`` whose layer ``layer`` (Mamba or DeltaNet, ``allow_neg_eigval``
    on) carries parity in its state: set after ``bos``, its sign flipped by every swap of the
    ``elements`` (identity, swap) (a transition of -1) and kept by the identity, read at every
    position and written as +/- READ_GAIN times over into the ``states`` (even, odd) tokens.
    Mamba's state is one column of one channel; DeltaNet's is S = v k^T along one key, which
    the swap reflects (β = 2: I - 2 k k^T) and the identity leaves (β = 0). Every other
    layer is passed through."""
    with torch.no_grad():
        model, vocab = _one_layer(config, layer, "parity_by_hand")
        mixer = model.layers[layer].mixer
        if not (isinstance(mixer, Mamba | DeltaNet) and mixer.options.allow_neg_eigval):
            raise ConfigError(
                f"model.layers[{layer}]: parity_by_hand needs Mamba or DeltaNet with "
                "allow_neg_eigval"
            )
        swap = elements[1]
        if isinstance(mixer, DeltaNet):
            _deltanet_parity(model, layer, (bos, *elements), states)
            return model
        _check_mamba_by_hand(mixer, layer, vocab, 1, "parity")
        x_one = _mamba_one_hot(model, layer, vocab)
        rank, state = mixer.dt_rank, mixer.d_state
        mixer.x_proj.weight.zero_()
        # Δ = 1 at <bos> and at the swap, about 0 at every other token.
        mixer.x_proj.weight[0, [bos, swap]] = 1.0 / x_one
        mixer.dt_proj.weight.zero_()
        mixer.dt_proj.weight[:, 0] = _DELTA_ONE - PARITY_REST
        mixer.dt_proj.bias.fill_(PARITY_REST)
        mixer.A_log.fill_(math.log(PARITY_DECAY))
        # <bos>'s channel writes 1 (Δ B x = 1) into state column 0, which C reads everywhere.
        mixer.x_proj.weight[rank, bos] = 1.0 / x_one**2
        mixer.x_proj.weight[rank + state, :vocab] = 1.0 / x_one
        mixer.D.zero_()
        mixer.out_proj.weight.zero_()
        mixer.out_proj.weight[states[0], bos] = READ_GAIN * EMBED
        mixer.out_proj.weight[states[1], bos] = -READ_GAIN * EMBED
    return model


def _token_weights(model: LanguageModel, layer: int, targets: dict[int, float]) -> torch.Tensor:
    """A row of weights over the token block whose dot product with the layer's normed input
    is ``targets[token]`` at each of those tokens (every position's normed residual is the
    same but for which token is hot: a small linear system)."""
    normed = _normed_token(model, layer).double()
    hot, cold = float(normed[0]), float(normed[1])
    tokens = list(targets)
    system = torch.full((len(tokens), len(tokens)), cold, dtype=torch.float64)
    system.fill_diagonal_(hot)
    wanted = torch.tensor([targets[t] for t in tokens], dtype=torch.float64)
    row = torch.zeros(model.embedding.weight.shape[1], dtype=torch.float64)
    row[tokens] = torch.linalg.solve(system, wanted)
    return row.float()


#: DeltaNet's parity: the pre-activations that open a projection (SiLU(4) is about 4) and that
#: close one or saturate a sigmoid (SiLU(-40) and sigmoid(-40) are about 4e-18).
OPEN, SHUT = 4.0, -40.0


def _deltanet_parity(
    model: LanguageModel, layer: int, tokens: tuple[int, int, int], states: tuple[int, int]
) -> None:
    """DeltaNet's weights for :func:`parity_by_hand`: q, k and v along the first coordinate
    of the first head (q and k L2-normalised: e_0 at <bos> and at the swap), v open at <bos>
    and shut at the swap; β = 2 sigmoid(b) is 1 at <bos> (S = v e_0^T), 2 at the swap (S
    reflected: S e_0 changes sign) and 0 at the identity."""
    bos, identity, swap = tokens
    mixer = model.layers[layer].mixer
    if mixer.o_norm is None:
        raise ConfigError(f"model.layers[{layer}]: parity_by_hand needs DeltaNet's output norm")
    rows = {
        mixer.q_proj: dict.fromkeys(tokens, OPEN),
        mixer.k_proj: {bos: OPEN, swap: OPEN},
        mixer.v_proj: {bos: OPEN, swap: SHUT},
    }
    for proj, targets in rows.items():
        proj.weight.zero_()
        proj.weight[0] = _token_weights(model, layer, targets)
    for conv in (mixer.q_conv, mixer.k_conv, mixer.v_conv):
        if isinstance(conv, nn.Identity):  # no short convs
            continue
        conv.weight.zero_()
        conv.weight[:, 0, conv.kernel_size - 1] = 1.0  # this position only
        if conv.bias is not None:
            conv.bias.zero_()
    mixer.b_proj.weight.zero_()
    mixer.b_proj.weight[:] = _token_weights(model, layer, {bos: 0.0, swap: -SHUT, identity: SHUT})
    # o = S q = ±|v| e_0 / sqrt(d_head); the head's RMSNorm makes it ±sqrt(d_head) e_0.
    gain = READ_GAIN * EMBED / mixer.head_dim**0.5
    mixer.o_proj.weight.zero_()
    mixer.o_proj.weight[states[0], 0] = gain
    mixer.o_proj.weight[states[1], 0] = -gain


def _mamba_one_hot(model: LanguageModel, layer: int, vocab: int) -> float:
    """Sets Mamba layer ``layer``'s in_proj and conv so that its channels x are one-hot:
    [0, vocab) this token, [vocab, 2 vocab) the previous one (the conv's taps), each exactly
    SiLU(1) where hot and 0 elsewhere after the conv's bias cancels what the norm leaves on
    the other coordinates; and its gate z SiLU's 1 at every position. Returns SiLU(1)."""
    mixer = model.layers[layer].mixer
    normed = _normed_token(model, layer)
    hot, cold = float(normed[0]), float(normed[1])
    t, inner = torch.arange(vocab), mixer.d_inner
    scale = 1.0 / (hot - cold)
    mixer.in_proj.weight.zero_()
    mixer.in_proj.weight[t, t] = scale  # this token
    mixer.in_proj.weight[vocab + t, t] = scale  # ... and, through the conv, the previous
    mixer.in_proj.weight[inner + t, :vocab] = _GATE_ONE / float(normed[:vocab].sum())
    conv = mixer.conv
    conv.weight.zero_()
    conv.weight[t, 0, conv.kernel_size - 1] = 1.0
    conv.weight[vocab + t, 0, conv.kernel_size - 2] = 1.0
    conv.bias.zero_()
    conv.bias[: 2 * vocab] = -cold * scale
    for projection in (mixer.in_proj, mixer.out_proj):  # biases where options.bias has them
        if projection.bias is not None:
            projection.bias.zero_()
    return F.silu(torch.tensor(1.0)).item()


def _check_mamba_by_hand(
    mixer: Mamba, layer: int, vocab: int, columns: int, purpose: str = "direct retrieval"
) -> None:
    """The Mamba layer :func:`_mamba_one_hot` sets can hold the mechanism (``purpose``): a
    conv of two taps or more with its bias, the state ``columns`` it needs (one per key
    where it binds), two channel blocks of the vocabulary."""
    if not (mixer.has_conv and mixer.conv.kernel_size >= 2 and mixer.conv.bias is not None):
        raise ConfigError(
            f"model.layers[{layer}]: {purpose} in Mamba needs its conv, with its bias"
        )
    if not columns or columns > mixer.d_state or 2 * vocab > mixer.d_inner:
        raise ConfigError(
            f"model.layers[{layer}]: {purpose} in Mamba needs 1..d_state "
            f"({mixer.d_state}) state columns (got {columns}) and d_inner >= 2 * vocab_size"
        )


def candidates_by_hand(config: ModelConfig, layer: int, first_value: int) -> LanguageModel:
    """A model of ``config`` for a task whose value tokens are the ids from ``first_value`` to
    the end of the vocabulary (AR's layout: ``task.value_id(0)``), whose layer ``layer``
    (one-head attention) attends from every position evenly to the value tokens before it
    and writes their tokens into the token block: at the query every value of the document
    scores alike, whichever the key. It has learned "answer with a value from the context"
    and no binding: the protocol's "candidates only (no binding)". A BaseConv layer with its
    long convolution does the same with a kernel of ones (each channel sums its token's
    occurrences so far) gated by a projection that opens the value channels alone; a Mamba
    layer and a one-head DeltaNet as :func:`_mamba_counts_values` and
    :func:`_deltanet_stores_values` say. Every other layer is passed through."""
    vocab, _, d = _layout(config)
    if not 0 <= layer < config.n_layers:
        raise ConfigError(f"candidates_by_hand: need 0 <= layer < {config.n_layers}")
    with torch.no_grad():
        model = _blank(config, (layer,))
        mixer = model.layers[layer].mixer
        values = torch.arange(first_value, vocab)
        if isinstance(mixer, BaseConv):
            _baseconv_counts_values(model, layer, first_value, vocab)
            return model
        if isinstance(mixer, Mamba):
            _mamba_counts_values(model, layer, values)
            return model
        if isinstance(mixer, DeltaNet):
            _deltanet_stores_values(model, layer, values)
            return model
        attention = _one_head_attention(model, layer)
        q, k, v = attention.qkv.weight.zero_().view(3, d, d)
        t = torch.arange(vocab)
        q[0, t] = 1.0  # the same at every position: each holds one token
        k[0, values] = 1.0  # large where the token is a value
        v[t, t] = 1.0
        attention.out_proj.weight.zero_()
        attention.out_proj.bias.zero_()
        attention.out_proj.weight[t, t] = READ_GAIN
    return model


def _mamba_counts_values(model: LanguageModel, layer: int, values: torch.Tensor) -> None:
    """Mamba's weights for :func:`candidates_by_hand`: its channels x one-hot (this token's
    block, :func:`_mamba_one_hot`), B_0 = C_0 = 1 at every position (the sum of that block
    over SiLU(1)), Δ = 1 and A ≈ 0: state column 0 adds up every token seen, so at the query
    each channel holds its token's count; the output projection passes the ``values``'
    channels alone, READ_GAIN times over."""
    mixer = model.layers[layer].mixer
    vocab = model.config.vocab_size
    _check_mamba_by_hand(mixer, layer, vocab, 1, "candidates only")
    x_one = _mamba_one_hot(model, layer, vocab)
    rank, state = mixer.dt_rank, mixer.d_state
    mixer.x_proj.weight.zero_()
    mixer.x_proj.weight[[rank, rank + state], :vocab] = 1.0 / x_one  # B_0 and C_0
    _mamba_adds(mixer)
    mixer.out_proj.weight[values, values] = READ_GAIN * EMBED / x_one


def _deltanet_stores_values(model: LanguageModel, layer: int, values: torch.Tensor) -> None:
    """DeltaNet's weights for :func:`candidates_by_hand`: key and value are this position's
    value token, one-hot (OPEN on its own coordinate and exactly 0 on the others, at every
    token: a value writes itself under its own key, orthogonal to the others'), β = 1 where
    a value stands and 0 elsewhere, and the query is the same at every position, open on
    every value's coordinate alike: S q is the sum of the values seen, each alike."""
    mixer = _one_head_deltanet(
        model, layer, "candidates_by_hand needs one-head DeltaNet with its short convolutions"
    )
    _deltanet_reads(mixer, ((values, 0), (values, 0), (values, 0)))  # the convs: lag 0
    tokens = range(model.config.vocab_size)
    mixer.q_proj.weight[values] = _token_weights(model, layer, dict.fromkeys(tokens, OPEN))
    for value in values.tolist():
        one_hot = _token_weights(model, layer, {t: OPEN * (t == value) for t in tokens})
        mixer.k_proj.weight[value] = mixer.v_proj.weight[value] = one_hot
    mixer.b_proj.weight.zero_()
    mixer.b_proj.weight[:, values] = DELTA_SCALE * 4  # as in _deltanet_binds
    mixer.o_proj.weight.zero_()
    mixer.o_proj.weight[values, values] = READ_GAIN


#: The BaseConv candidates layer's gate on the value channels: its count of a value seen once
#: (about 6.5 at AR's quick lengths) times this outweighs the query key's own coordinate.
COUNT_GAIN = 4.0


def _baseconv_counts_values(model: LanguageModel, layer: int, first_value: int, vocab: int) -> None:
    """BaseConv's weights for :func:`candidates_by_hand`: y = conv(u) * projection(u) + u with
    the long convolution's kernel 1 at every lag (its filter's last Linear: weight 0, bias 1),
    so that channel c sums the normed inputs so far (a value seen raises its channel by the
    gap between a hot and a cold coordinate), and the projection a constant COUNT_GAIN on
    the value channels, 0 elsewhere."""
    mixer = model.layers[layer].mixer
    if not isinstance(mixer.conv, ImplicitLongConv) or mixer.use_act:
        raise ConfigError(
            f"model.layers[{layer}]: candidates_by_hand needs BaseConv's long convolution "
            "(kernel_size -1) without use_act"
        )
    last = mixer.conv.filter.mlp[-1]
    last.weight.zero_()
    last.bias.fill_(1.0)
    mixer.projection.weight.zero_()
    mixer.projection.bias.zero_()
    mixer.projection.bias[first_value:vocab] = COUNT_GAIN


def _copy_previous(attention: Attention, vocab: int, length: int, d: int) -> None:
    """Query at position p matches key at p - 1 (head coordinates j: the query reads position
    j + 1, the key position j); the value is the token, written into the previous-token
    block."""
    q, k, v = attention.qkv.weight.zero_().view(3, d, d)
    pos = 2 * vocab
    j = torch.arange(length - 1)
    q[j, pos + j + 1] = 1.0
    k[j, pos + j] = 1.0
    v[torch.arange(vocab), torch.arange(vocab)] = 1.0
    attention.out_proj.weight.zero_()
    attention.out_proj.bias.zero_()
    attention.out_proj.weight[vocab + torch.arange(vocab), torch.arange(vocab)] = 1.0


def _read_after_match(attention: Attention, vocab: int, d: int) -> None:
    """Query: the token; key: the previous token; value: the token, written back into the
    token block READ_GAIN times over."""
    q, k, v = attention.qkv.weight.zero_().view(3, d, d)
    t = torch.arange(vocab)
    q[t, t] = 1.0
    k[t, vocab + t] = 1.0
    v[t, t] = 1.0
    attention.out_proj.weight.zero_()
    attention.out_proj.bias.zero_()
    attention.out_proj.weight[t, t] = READ_GAIN
