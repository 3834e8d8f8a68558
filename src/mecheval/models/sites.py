"""Intervention sites: identity modules with stable dotted names.

A site is an ``nn.Identity`` that lives at the submodule path its name spells, so
``model.get_submodule("layers.0.mixer.output")`` and a plain ``register_forward_hook``
reach the same activation that mecheval's own engine patches. Every site sees a tensor of
shape [B, T, C].
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn


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
