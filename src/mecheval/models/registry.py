"""The explicit architecture registry: name -> mixer builder + typed options.

Configs name an architecture by its registry key; no dotted import strings.

Architectures from outside the package (docs/custom-architecture.md) register the same way,
with the :func:`architecture` decorator, from

* a plugin file: ``mecheval --plugin my_mixer.py ...`` (or :func:`use_plugins`); the paths
  are also put in ``$MECHEVAL_PLUGINS`` so that worker processes load them too;
* an installed package's entry point in the group ``mecheval.architectures`` (the entry
  point names a module, imported on first lookup of an unknown name).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from mecheval.errors import ConfigError, validate
from mecheval.models.config import HYBRID_JOIN, PARALLEL_JOIN
from mecheval.models.mixers.attention import Attention, AttentionOptions
from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.baseconv import BaseConvOptions, build_baseconv
from mecheval.models.mixers.based import BasedOptions, build_based
from mecheval.models.mixers.deltanet import DeltaNet, DeltaNetOptions
from mecheval.models.mixers.gated_deltanet import GatedDeltaNet, GatedDeltaNetOptions
from mecheval.models.mixers.gla import GLA, GLAOptions
from mecheval.models.mixers.h3 import H3, H3Options
from mecheval.models.mixers.hawk import Hawk, HawkOptions
from mecheval.models.mixers.hyena import Hyena, HyenaOptions
from mecheval.models.mixers.mamba import Mamba, MambaOptions
from mecheval.models.mixers.mamba2 import Mamba2, Mamba2Options
from mecheval.models.mixers.mamba3 import Mamba3, Mamba3Options
from mecheval.models.mixers.retnet import RetNet, RetNetOptions

#: (layer index, d_model, validated options) -> mixer for that layer
MixerBuilder = Callable[[int, int, BaseModel], Mixer]


@dataclass(frozen=True)
class Architecture:
    name: str
    options: type[BaseModel]
    build: MixerBuilder
    description: str
    #: how reports and tables name it ("Mamba", "DeltaNet"); empty: the registry name
    label: str = ""
    mlp: bool = True  # Mamba blocks have no MLP
    norm: Literal["layer", "rms"] = "layer"  # pre-norm of each block; the final norm is LayerNorm
    #: weight init of the whole model: "zoology" (GPT-2 style, every Linear N(0, init_std)) or
    #: "mamba" (mamba_ssm's: PyTorch's default Linear init); see models/backbone.py.
    init: Literal["zoology", "mamba"] = "zoology"
    #: learned absolute positions unless ``model.position_embedding`` says otherwise. The
    #: paper's figures train attention with them and every other mixer without (tinylang's
    #: ar_32 / pcfg_easy for attention, ar_32_nope / pcfg_easy_nope for the rest; App. D.1:
    #: "in the zoology codebase, only Attention is meant to be trained this way")
    position_embedding: bool = False
    #: the short-convolution switch (``model.short_conv``): the mixer option that sizes the
    #: architecture's own short conv(s), which accepts null to remove them ("d_conv"); None:
    #: it has none, and the switch adds one on the mixer's input
    short_conv: str | None = None
    #: why the switch is refused for this architecture ("" = it is not), e.g. convs that
    #: differ per layer, where "the" short conv would be ambiguous
    no_conv_switch: str = ""

    @property
    def display(self) -> str:
        return self.label or self.name


ARCHITECTURES: dict[str, Architecture] = {}

PLUGIN_ENV = "MECHEVAL_PLUGINS"
ENTRY_POINT_GROUP = "mecheval.architectures"
_loaded_plugins: set[Path] = set()
_discovered = False


class NoOptions(BaseModel):
    """The options of an architecture that has none: any key is an error."""

    model_config = ConfigDict(extra="forbid")


def register(arch: Architecture) -> Architecture:
    if arch.name in ARCHITECTURES:
        raise ConfigError(f"architecture {arch.name!r}: registered twice")
    ARCHITECTURES[arch.name] = arch
    return arch


Buildable = TypeVar("Buildable", bound=Callable)


def architecture(
    name: str,
    *,
    options: type[BaseModel] = NoOptions,
    description: str = "",
    label: str = "",
    mlp: bool = True,
    norm: Literal["layer", "rms"] = "layer",
    init: Literal["zoology", "mamba"] = "zoology",
    position_embedding: bool = False,
    short_conv: str | None = None,
    no_conv_switch: str = "",
) -> Callable[[Buildable], Buildable]:
    """Register a mixer under ``name``: decorate a :class:`Mixer` subclass built as
    ``cls(d_model, options)``, or a builder ``(layer, d_model, options) -> Mixer`` for an
    architecture whose layers differ (like Based). ``options`` is the pydantic model of its
    ``model.mixer`` settings; ``short_conv`` names the option that sizes its own short conv
    (null: none), if it has one, for ``model.short_conv`` to set; the other keywords are
    :class:`Architecture`'s fields."""

    def decorate(target: Buildable) -> Buildable:
        if isinstance(target, type) and issubclass(target, Mixer):
            cls = target

            def build(layer: int, d_model: int, opts: BaseModel) -> Mixer:
                return cls(d_model, opts)
        elif callable(target):
            build = target
        else:
            raise TypeError(f"architecture {name!r}: expected a Mixer subclass or a builder")
        _check_name(name)
        doc = (target.__doc__ or "").strip().split("\n")[0]
        register(
            Architecture(
                name,
                options,
                build,
                description or doc,
                label=label,
                mlp=mlp,
                norm=norm,
                init=init,
                position_embedding=position_embedding,
                short_conv=short_conv,
                no_conv_switch=no_conv_switch,
            )
        )
        return target

    return decorate


def load_plugin(path: str | Path) -> list[str]:
    """Import a plugin file (once per path); return the architectures it registered."""
    path = Path(path).expanduser().resolve()
    if path in _loaded_plugins:
        return []
    if not path.is_file() or path.suffix != ".py":
        raise ConfigError(f"--plugin {path}: expected an existing .py file")
    before = set(ARCHITECTURES)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    module_name = f"mecheval_plugin_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        # Leave nothing half-registered behind.
        del sys.modules[module_name]
        for name in set(ARCHITECTURES) - before:
            del ARCHITECTURES[name]
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        raise ConfigError(
            f"--plugin {path}: failed to import ({where}): {type(err).__name__}: {err}"
        ) from err
    _loaded_plugins.add(path)
    return sorted(set(ARCHITECTURES) - before)


def use_plugins(paths: Iterable[str | Path]) -> list[str]:
    """Load plugin files here and make worker processes started from now on load them too."""
    paths = [str(Path(p).expanduser().resolve()) for p in paths]
    registered = [name for path in paths for name in load_plugin(path)]
    known = [p for p in os.environ.get(PLUGIN_ENV, "").split(os.pathsep) if p]
    os.environ[PLUGIN_ENV] = os.pathsep.join(dict.fromkeys([*known, *paths]))
    return registered


def plugin_paths() -> list[str]:
    """The plugin files this process was asked to load (for jobs sent to other machines)."""
    return [p for p in os.environ.get(PLUGIN_ENV, "").split(os.pathsep) if p]


def discover() -> None:
    """Load ``$MECHEVAL_PLUGINS`` and the ``mecheval.architectures`` entry points, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for path in plugin_paths():
        load_plugin(path)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except Exception as err:
            raise ConfigError(
                f"entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP}): failed to "
                f"import: {type(err).__name__}: {err}"
            ) from None
        if isinstance(loaded, Architecture) and loaded.name not in ARCHITECTURES:
            register(loaded)


def _check_name(name: str) -> None:
    """A registered name cannot hold what joins a hybrid's layers in its name."""
    if HYBRID_JOIN in name or PARALLEL_JOIN in name:
        raise ValueError(f"architecture {name!r}: '+' and '~' join a hybrid's layers")


def available_architectures() -> list[str]:
    """Every registered architecture name, plugins and entry points included."""
    discover()
    return list(ARCHITECTURES)


def get_architecture(name: str, field: str = "model.architecture") -> Architecture:
    """The registered architecture ``name``; a ConfigError naming ``field`` if none is."""
    if name not in ARCHITECTURES:
        discover()
    try:
        return ARCHITECTURES[name]
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ConfigError(
            f"{field}: unknown {name!r} (expected one of: {known}; a custom "
            "architecture needs --plugin FILE or an installed entry point)"
        ) from None


def architecture_label(name: str) -> str:
    """How reports name an architecture: its label, or the name itself if not registered; a
    hybrid's (``mamba+attention``) its layers' labels joined."""
    for join in (HYBRID_JOIN, PARALLEL_JOIN):
        if join in name:
            return join.join(architecture_label(part) for part in name.split(join))
    arch = ARCHITECTURES.get(name)
    return name if arch is None else arch.display


def architecture_rank(name: str) -> int:
    """Its place in the registry's order (the paper's for built-ins); unknown names last."""
    order = list(ARCHITECTURES)
    return order.index(name) if name in order else len(order)


def parse_options(name: str, options: dict, field: str = "model.mixer") -> BaseModel:
    """``options`` validated as architecture ``name``'s (errors name ``field``)."""
    return validate(get_architecture(name).options, options, prefix=field)


def _register_paper_architectures() -> None:
    """The paper's seven, with the decorator plugins use, in the order of its figures (Fig. 3,
    top to bottom): reports, tables and `reproduce` list built-in architectures in this order;
    plugins follow in registration order."""
    architecture(
        "mamba",
        label="Mamba",
        options=MambaOptions,
        description="Mamba-1 selective SSM with short conv (Gu & Dao, 2023); no MLP, RMSNorm",
        mlp=False,
        norm="rms",
        init="mamba",
        short_conv="d_conv",
    )(Mamba)

    architecture(
        "hyena",
        label="Hyena",
        options=HyenaOptions,
        description="Hyena order 2: short conv, gating, implicit long conv (Poli et al., 2023)",
        short_conv="short_filter_order",
    )(Hyena)

    architecture(
        "h3",
        label="H3",
        options=H3Options,
        description="H3: q * DiagSSM(ShiftSSM(k) * v), S4D-Lin diagonal SSM (Fu et al., 2023)",
    )(H3)

    architecture(
        "deltanet",
        label="DeltaNet",
        options=DeltaNetOptions,
        description="DeltaNet: delta-rule linear attention with short convs (Yang et al., 2024)",
        short_conv="conv_size",
    )(DeltaNet)

    architecture(
        "based",
        label="Based",
        options=BasedOptions,
        description="Based hybrid: BaseConv short-conv layers alternating with Taylor-feature "
        "linear attention (Arora et al., 2024b)",
        no_conv_switch="alternates short-conv (BaseConv) and linear-attention layers: set the "
        "BaseConv layers' kernel with model.mixer.conv_kernel_size",
    )(build_based)

    architecture(
        "baseconv",
        label="BaseConv",
        options=BaseConvOptions,
        description="BaseConv: conv(u) * linear(u) + u, conv size per layer from a cycled list "
        "(-1 = implicit long conv) (Arora et al., 2024a)",
        no_conv_switch="sizes its conv per layer, short or long (model.mixer.kernel_size): "
        "its conv is the architecture itself",
    )(build_baseconv)

    architecture(
        "attention",
        label="Attention",
        options=AttentionOptions,
        description="causal softmax attention (Transformer)",
        position_embedding=True,
    )(Attention)


_register_paper_architectures()

#: The paper's seven architectures, in the paper's order: what experiments compare by default.
PAPER_ARCHITECTURES = tuple(ARCHITECTURES)


def _register_more_architectures() -> None:
    """The architectures beyond the paper, registered after its seven; `reproduce --archs all`
    adds them to an experiment."""
    architecture(
        "mamba2",
        label="Mamba-2",
        options=Mamba2Options,
        description="Mamba-2: SSD, a selective SSM with one scalar decay per head, one short "
        "conv over x, B, C and a gated RMSNorm (Dao & Gu, 2024); no MLP, RMSNorm",
        # mamba_ssm's Mamba-2 LM is built like its Mamba LM: no MLP, RMSNorm, its init.
        mlp=False,
        norm="rms",
        init="mamba",
        short_conv="d_conv",
    )(Mamba2)

    architecture(
        "gated_deltanet",
        label="Gated DeltaNet",
        options=GatedDeltaNetOptions,
        description="Gated DeltaNet: the delta rule with a Mamba-2 style decay gate, short "
        "convs and an output gate (Yang et al., 2025)",
        short_conv="conv_size",
    )(GatedDeltaNet)

    architecture(
        "gla",
        label="GLA",
        options=GLAOptions,
        description="GLA: linear attention with a data-dependent per-channel decay and a "
        "gated output, as fla's layer (Yang et al., 2024)",
        short_conv="conv_size",
    )(GLA)

    architecture(
        "retnet",
        label="RetNet",
        options=RetNetOptions,
        description="RetNet: multi-scale retention, fixed decay per head and RoPE, as fla's "
        "layer (Sun et al., 2023)",
    )(RetNet)

    architecture(
        "hawk",
        label="Hawk",
        options=HawkOptions,
        description="Hawk: Griffin's recurrent block, conv + RG-LRU gated by a GeLU branch, as "
        "recurrentgemma (De et al., 2024)",
        short_conv="conv_size",
    )(Hawk)

    architecture(
        "mamba3",
        label="Mamba-3",
        options=Mamba3Options,
        description="Mamba-3 (SISO): exponential-trapezoidal SSM with a data-dependent decay, "
        "rotated (complex) state, B/C norms and biases, no short conv (Lahoti et al., 2026); "
        "no MLP, RMSNorm",
        # Built as our Mamba-2 LM (no MLP, RMSNorm, mamba_ssm's init): the two differ in the
        # mixer alone.
        mlp=False,
        norm="rms",
        init="mamba",
        short_conv="d_conv",
    )(Mamba3)


_register_more_architectures()

#: Every architecture that comes with mecheval: the paper's, then the others.
BUILTIN_ARCHITECTURES = tuple(ARCHITECTURES)
