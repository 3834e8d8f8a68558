"""Reading and overwriting site activations: context managers that always remove their hooks.

Hooks are global state on the model; every temporary hook here lives in a ``with`` block
that removes it on exit, also when the forward raises.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from mecheval.models.sites import get_site


@contextmanager
def record(model: nn.Module, sites: Sequence[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Cache the activation of every site in ``sites`` during the forwards inside the block
    (the last forward wins): ``with record(model, names) as acts: model(tokens)``."""
    cache: dict[str, torch.Tensor] = {}
    handles = []
    try:
        for name in sites:

            def keep(module: nn.Module, inputs: object, output: torch.Tensor, name=name) -> None:
                cache[name] = output.detach()

            handles.append(get_site(model, name).register_forward_hook(keep))
        yield cache
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def patch(
    model: nn.Module,
    site: str,
    positions: torch.Tensor,
    values: torch.Tensor,
    length: int | None = None,
) -> Iterator[None]:
    """Overwrite row b of ``site`` at token ``positions[b]`` with ``values[b]`` ([B, C]) in
    every forward inside the block; everything downstream sees the patched activation.

    With ``length`` (the documents' length) a site that sees fewer positions sees the last
    ones, as a block resumed from a prefix does (interventions/prefix.py): position p is
    then at index p - (length - seen)."""

    def overwrite(module: nn.Module, inputs: object, output: torch.Tensor) -> torch.Tensor:
        if output.shape[0] != positions.shape[0]:
            raise ValueError(
                f"patch {site}: {positions.shape[0]} positions for a batch of {output.shape[0]}"
            )
        index = positions if length is None else positions - (length - output.shape[1])
        if bool((index < 0).any()):
            raise ValueError(f"patch {site}: a patched position lies before the resumed window")
        output = output.clone()
        output[torch.arange(output.shape[0], device=output.device), index] = values.to(output.dtype)
        return output

    handle = get_site(model, site).register_forward_hook(overwrite)
    try:
        yield
    finally:
        handle.remove()
