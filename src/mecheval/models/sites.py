"""Intervention sites: identity modules with stable dotted names.

A site is an ``nn.Identity`` that lives at the submodule path its name spells, so
``model.get_submodule("layers.0.mixer.output")`` and a plain ``register_forward_hook``
reach the same activation that mecheval's own engine patches. Every site sees a tensor of
shape [B, T, C].
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from torch import nn

# ------------------------------------------------------------------------ the name grammar
# A site name is ``layers.{i}.<path inside block i>.{input,output}`` or ``final_norm.input``.
# A *template* may write ``{last}`` for the layer index, meaning each model's last layer.

FINAL_NORM_INPUT = "final_norm.input"
LAST = "{last}"
_IN_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_BLOCK_INPUT = re.compile(r"^layers\.\d+\.input$")
_BRANCH_OUTPUT = re.compile(r"^layers\.\d+\.mixer\.branches\.\d+\.output$")


class SiteParts(NamedTuple):
    """A site name in the tidy results' columns: layer (-1 outside the blocks), the
    component it belongs to (``block`` for a block's own input/output) and ``input``/``output``."""

    layer: int
    component: str
    io: str


def layer_site(layer: int | str, path: str) -> str:
    """``layer_site(1, "mixer.output")`` -> ``layers.1.mixer.output``."""
    return f"layers.{layer}.{path}"


def last_layer_input(n_layers: int) -> str:
    """The input of the last block: where a restore separates induction from direct retrieval."""
    return layer_site(n_layers - 1, "input")


def resolve_site(template: str, n_layers: int) -> str:
    """A site template (``layers.{last}.input``) for a model with ``n_layers`` blocks."""
    return template.format(last=n_layers - 1)


def describe_site(template: str) -> str:
    """A site template as prose, for titles: ``layers.{last}.input`` -> "the last layer's input"."""
    split = split_layer(template)
    if split is None:
        return template
    layer, path = split
    where = "the last layer" if layer == LAST else f"layer {layer}"
    return f"{where}'s {path.replace('.', ' ')}"


def split_layer(name: str) -> tuple[str, str] | None:
    """``layers.1.mixer.output`` -> ("1", "mixer.output"); None for a site outside the blocks."""
    if name.startswith(f"layers.{LAST}."):
        return LAST, name[len(f"layers.{LAST}.") :]
    match = _IN_LAYER.match(name)
    return None if match is None else (match.group(1), match.group(2))


def parse_site(name: str) -> SiteParts:
    """``layers.1.mixer.conv.output`` -> (1, "conv", "output"); ``final_norm.input`` ->
    (-1, "final_norm", "input")."""
    split = split_layer(name)
    if split is None:
        parts = name.split(".")
        return SiteParts(-1, parts[0], parts[-1])
    layer, path = split
    inner = path.split(".")
    return SiteParts(int(layer), inner[-2] if len(inner) > 1 else "block", inner[-1])


# ------------------------------------------------------------------------ sites in a model


class Site(nn.Identity):
    """A named point in the forward pass where an activation can be read or overwritten."""

    name: str = ""


def iter_sites(model: nn.Module) -> Iterator[tuple[str, Site]]:
    """(dotted name, module) for every site of ``model``, in forward order of construction."""
    for path, module in model.named_modules():
        if isinstance(module, Site):
            yield path, module


def site_names(model: nn.Module) -> list[str]:
    return [name for name, _ in iter_sites(model)]


#: The recurrent state a mixer carries from one position to the next (``layers.{i}.mixer.state``):
#: not a module but a value the engine patches through ``Mixer.mix_from(replace=True)``, for
#: mixers that carry a "state" (``Mixer.carries``). Patching it at position r sets the state
#: after r, which the mixer's output at r and everything after it read, to the source run's.
STATE = "mixer.state"


def state_site_names(model: nn.Module) -> list[str]:
    """The state sites of ``model``: one per block whose mixer has a recurrent state (and no
    module of its own named ``state``, which stays an ordinary site)."""
    return [
        layer_site(i, STATE)
        for i, layer in enumerate(getattr(model, "layers", []))
        if getattr(layer.mixer, "carries", None) == "state" and not hasattr(layer.mixer, "state")
    ]


def boundary_sites(model: nn.Module) -> list[str]:
    """Where a model's layers meet, in forward order: each block's input, ``final_norm.input``,
    and the output of each branch of a parallel layer (``layers.{i}.mixer.branches.{k}.output``),
    the sites that say which layer, and which branch, brings an answer to a position."""
    return [
        name
        for name in site_names(model)
        if name == FINAL_NORM_INPUT or _BLOCK_INPUT.match(name) or _BRANCH_OUTPUT.match(name)
    ]


def state_site_layer(name: str) -> int | None:
    """The block of a state site name (``layers.1.mixer.state`` -> 1); None for other sites."""
    split = split_layer(name)
    if split is None or split[1] != STATE or not split[0].isdigit():
        return None
    return int(split[0])


def local_mixing_sites(model: nn.Module, layer: int) -> list[str]:
    """The output sites of block ``layer``'s short mixing steps, in forward order: every
    submodule marked ``local_mixing = True`` (``ShortConv``, H3's shift SSM) that has an
    ``output`` site. They are where a one-layer model can bind a key to the next token before
    its only sequence mixer (Olsson et al.'s one-layer attention with a length-2 conv)."""
    prefix = f"layers.{layer}."
    return [
        f"{path}.output"
        for path, module in model.named_modules()
        if path.startswith(prefix)
        and getattr(module, "local_mixing", False)
        and isinstance(getattr(module, "output", None), Site)
    ]


def get_site(model: nn.Module, name: str) -> Site:
    try:
        module = model.get_submodule(name)
    except AttributeError:
        module = None
    if not isinstance(module, Site):
        known = ", ".join(site_names(model))
        raise KeyError(f"site {name!r}: not a site of this model (known: {known})")
    return module


def name_sites(model: nn.Module) -> None:
    """Record each site's dotted path on the site itself (for error messages and hooks)."""
    for path, site in iter_sites(model):
        site.name = path
