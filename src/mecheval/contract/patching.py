"""The contract's checks of what the intervention engine reads and writes: the sites, patching
them, and each mixer resumed from its prefix states (what each guards:
:mod:`mecheval.contract`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mecheval.contract.fixtures import (
    D_MODEL,
    SIGNAL_INIT_STD,
    make_model,
    max_diff,
    random_tokens,
    require,
)
from mecheval.models.backbone import layer_architectures
from mecheval.models.sites import Site, get_site, iter_sites, site_names


def check_sites(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options)
    names = site_names(model)
    require(len(names) == len(set(names)), "site names are not unique")
    absent = sorted(_expected_sites(model) - set(names))
    require(not absent, f"missing sites: {', '.join(absent)}")
    seen, stray = _fired_sites(model)
    require(
        not stray,
        f"an unlisted Site fired inside {stray[0] if stray else ''}: a site must be a submodule "
        "when the model is built, or it cannot be read or patched by name",
    )
    silent = sorted(set(names) - set(seen))
    require(not silent, f"sites that never fired: {', '.join(silent)}")
    for name, shapes in seen.items():
        require(len(shapes) == 1, f"{name}: fired {len(shapes)} times in one forward")
        require(
            len(shapes[0]) == 3 and shapes[0][:2] == (3, 11),
            f"{name}: saw shape {tuple(shapes[0])}, expected [B=3, T=11, C]",
        )
        require(get_site(model, name).name == name, f"{name}: not named by its path")
    return f"{len(names)} sites, each fired once with [B, T, C]"


def _expected_sites(model: torch.nn.Module) -> set[str]:
    """The sites every model has: each block's input, output and mixer's, its MLP's where it
    has one, and ``final_norm.input``."""
    expected = {"final_norm.input"}
    # A block is its architecture's (a parallel layer's: its first branch's), MLP or none.
    for i, branches in enumerate(layer_architectures(model.config)):
        expected |= {f"layers.{i}.{s}" for s in ("input", "output", "mixer.input", "mixer.output")}
        if branches[0].mlp:
            expected |= {f"layers.{i}.mlp.input", f"layers.{i}.mlp.output"}
    return expected


def _fired_sites(model: torch.nn.Module) -> tuple[dict[str, list[tuple[int, ...]]], list[str]]:
    """One forward of three 11-token documents: the shapes each listed site saw, and where a
    Site fired that is not listed."""
    seen: dict[str, list[tuple[int, ...]]] = {}
    handles = [
        site.register_forward_hook(lambda m, i, o, n=name: seen.setdefault(n, []).append(o.shape))
        for name, site in iter_sites(model)
    ]
    # Every module call, to catch a Site that fires but is not listed (made in the forward, or
    # kept outside the module tree): it could be neither read nor patched by name.
    listed = {id(site) for _, site in iter_sites(model)}
    paths = {id(module): name for name, module in model.named_modules()}
    inside: list[str] = []
    stray: list[str] = []

    def enter(module: torch.nn.Module, inputs: Any) -> None:
        if id(module) in paths:
            inside.append(paths[id(module)])

    def leave(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if isinstance(module, Site) and id(module) not in listed:
            stray.append(inside[-1] if inside else "the model")
        if id(module) in paths:
            inside.pop()

    handles += [
        torch.nn.modules.module.register_module_forward_pre_hook(enter),
        torch.nn.modules.module.register_module_forward_hook(leave),
    ]
    try:
        with torch.no_grad():
            model(random_tokens(3, 11), at=torch.tensor([10, 10, 10]))
    finally:
        for handle in handles:
            handle.remove()
    return seen, stray


def check_resume(arch: str, options: Mapping[str, Any] | None = None) -> str:
    """Every mixer resumed at every cut p from its own prefix (``Mixer.prefix``,
    ``Prefix.initial_state``, ``Mixer.forward_from``) gives its full forward's outputs at p..
    (float64); with a recurrent state, replacing the state after p by itself changes nothing
    either."""
    model = make_model(arch, options, short_conv=None).double()
    x = torch.randn(3, 11, D_MODEL, generator=torch.Generator().manual_seed(5), dtype=torch.double)
    rows = torch.tensor([2, 0])
    worst, kinds = 0.0, set()
    with torch.no_grad():
        for i, mixer in enumerate(layer.mixer for layer in model.layers):
            full = mixer(x)
            prefix = mixer.prefix(x)
            kind = "recomputes its window" if prefix is None else f"resumes (halo {prefix.halo})"
            kinds.add(kind)
            for start in range(x.shape[1]):
                lo = 0 if prefix is None else max(0, start - prefix.halo)
                state = None if prefix is None else prefix.initial_state(rows, start)
                got = mixer.forward_from(x[rows, lo:], start - lo, state)
                diff = max_diff(got, full[rows, start:])
                require(diff < 1e-10, f"layers.{i}.mixer resumed at {start} differs by {diff:.2e}")
                worst = max(worst, diff)
                if prefix is not None and prefix.carries == "state":
                    after = prefix.after(rows, start)
                    got = mixer.forward_from(x[rows, lo:], start - lo, after, replace=True)
                    diff = max_diff(got, full[rows, start:])
                    require(
                        diff < 1e-10,
                        f"layers.{i}.mixer: its own state after {start} put back differs by "
                        f"{diff:.2e}",
                    )
    return f"{', '.join(sorted(kinds))}: within {worst:.1e} of the full forward (float64)"


def check_site_patching(arch: str, options: Mapping[str, Any] | None = None) -> str:
    # A large init, so that every path carries signal: at init_std 0.02 a Hyena long filter is
    # ~1e-4 and a patch of the mixer input would move the logits by less than round-off.
    model = make_model(arch, options, init_std=SIGNAL_INIT_STD)
    x = random_tokens(2, 19)
    with torch.no_grad():
        ref = model(x)
        for name, site in iter_sites(model):
            handle = site.register_forward_hook(lambda m, i, o: o.clone())
            try:
                diff = max_diff(model(x), ref)
            finally:
                handle.remove()
            require(diff == 0.0, f"{name}: overwriting with its own value changed logits")
    p = 9
    # A random direction: a constant shift would vanish under a LayerNorm.
    direction = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(4))

    def bump(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[:, p] += direction
        return output

    for layer in range(2):
        site = get_site(model, f"layers.{layer}.mixer.input")
        with torch.no_grad():
            handle = site.register_forward_hook(bump)
            try:
                out = model(x)
            finally:
                handle.remove()
        before = max_diff(out[:, :p], ref[:, :p])
        require(before == 0.0, f"{site.name}: a patch at t={p} changed outputs before it")
        require(max_diff(out[:, p], ref[:, p]) > 1e-5, f"{site.name}: a patch had no effect")
    return "self-patches are no-ops; a patch at t acts from t on"
