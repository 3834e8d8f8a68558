"""Datasets: building the train/dev/test splits of a task config, caching and batching.

Documents are a pure function of the config (its ``seed`` included): each split draws from
its own seeded stream, so the same config gives the same documents byte for byte.

Cache: one safetensors file per config, ``<kind>-<hash>.safetensors``, where the hash covers
the config and :data:`FORMAT_VERSION`. Its metadata records the full config; a file that is
truncated, unreadable, of another config or with inconsistent shapes is rebuilt and replaced
(atomically: temp file + ``os.replace``), never trusted. ATR trees are stored in the same
file (flat arrays with offsets), so a reloaded dataset is complete.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from mecheval.io import atomic_save_safetensors
from mecheval.tasks.base import SPLITS, TaskConfigBase
from mecheval.tasks.batch import Batch
from mecheval.tasks.documents import Documents

#: Bump when generation changes, so stale caches are never reused.
#: 2: rules are a head slot plus 1..L_max-1 symbols, yields under 3 symbols are rejected,
#: heads are drawn per expansion and stored with the trees (``trees.heads``).
FORMAT_VERSION = 2


@dataclass
class TaskDataset(Documents):
    """One split of a task config: its documents, ``tokens [N, T]`` right-padded with 0 to the
    split's longest."""

    cfg: TaskConfigBase = field(kw_only=True)
    split: str = field(kw_only=True)

    @property
    def id_names(self) -> list[str]:
        """Printable name of every id (the config's ``id_names()``)."""
        return self.cfg.id_names()

    def batch(self, indices: torch.Tensor) -> Batch:
        """The documents at ``indices``, padding trimmed to the batch's longest, with their
        answer candidates (the task's ``answer_candidates``)."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        lengths = self.lengths[indices]
        width = int(lengths.max()) if len(indices) else 1
        batch = Batch(
            tokens=self.tokens[indices, :width],
            answer=self.answer[indices],
            roles={r: pos[indices] for r, pos in self.roles.items()},
            lengths=lengths,
            extras={k: v[indices] for k, v in self.extras.items()},
        )
        return replace(batch, candidates=self.cfg.answer_candidates(batch))

    def iter_batches(
        self,
        batch_size: int,
        shuffle: bool,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[Batch]:
        if batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        stop = n - n % batch_size if drop_last else n
        for i in range(0, stop, batch_size):
            yield self.batch(order[i : i + batch_size])

    def document(self, i: int) -> list[int]:
        """Document ``i``'s token ids, without padding."""
        return self.tokens[i, : int(self.lengths[i])].tolist()

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"tokens": self.tokens, "answer": self.answer, "lengths": self.lengths}
        out.update({f"roles.{r}": v for r, v in self.roles.items()})
        out.update({f"extras.{k}": v for k, v in self.extras.items()})
        if self.trees is not None:
            out.update({f"trees.{k}": v for k, v in self.trees.tensors().items()})
        return out

    @classmethod
    def from_tensors(
        cls, cfg: TaskConfigBase, split: str, t: dict[str, torch.Tensor]
    ) -> TaskDataset:
        trees = None
        tree_class = cfg.tree_class
        if tree_class is not None:
            trees = tree_class.from_tensors(
                {k[len("trees.") :]: v for k, v in t.items() if k.startswith("trees.")}
            )
        ds = cls(
            cfg=cfg,
            split=split,
            tokens=t["tokens"],
            answer=t["answer"],
            roles={r: t[f"roles.{r}"] for r in cfg.roles()},
            lengths=t["lengths"],
            extras={k[len("extras.") :]: v for k, v in t.items() if k.startswith("extras.")},
            trees=trees,
        )
        ds._check()
        return ds

    def _check(self) -> None:
        """Shape and range consistency; raises ValueError (a cache file that fails is rebuilt)."""
        n = self.tokens.shape[0]
        if self.tokens.dim() != 2 or self.tokens.dtype != torch.long:
            raise ValueError("tokens")
        for name, v in [("answer", self.answer), ("lengths", self.lengths), *self.roles.items()]:
            if v.shape != (n,) or v.dtype != torch.long:
                raise ValueError(name)
        if n and (int(self.lengths.max()) > self.tokens.shape[1] or int(self.lengths.min()) < 2):
            raise ValueError("lengths")
        if n and not bool((self.roles["query"] == self.lengths - 1).all()):
            raise ValueError("roles")
        if self.trees is not None:
            self.trees.check(n)


def config_hash(cfg: TaskConfigBase) -> str:
    blob = json.dumps({"v": FORMAT_VERSION, "cfg": cfg.model_dump(mode="json")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cache_path(cfg: TaskConfigBase, cache_dir: Path) -> Path:
    return Path(cache_dir) / f"{cfg.kind}-{config_hash(cfg)}.safetensors"


def _generate(cfg: TaskConfigBase) -> dict[str, TaskDataset]:
    shared = cfg.shared_state()
    out = {}
    for split in SPLITS:
        documents = cfg.generate(split, cfg.split_size(split), shared)
        out[split] = TaskDataset(**vars(documents), cfg=cfg, split=split)
    return out


def _load(cfg: TaskConfigBase, path: Path) -> dict[str, TaskDataset] | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("config_hash") != config_hash(cfg):
                return None
            if json.loads(meta.get("config", "null")) != cfg.model_dump(mode="json"):
                return None
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
        out = {}
        for split in SPLITS:
            prefix = f"{split}/"
            part = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            out[split] = TaskDataset.from_tensors(cfg, split, part)
    except Exception:
        # Truncated, corrupt or inconsistent: rebuild rather than trust any of it.
        return None
    if any(len(out[s]) != cfg.split_rows(s) for s in SPLITS):
        return None
    return out


def build_datasets(
    cfg: TaskConfigBase, cache_dir: Path | str | None = None
) -> dict[str, TaskDataset]:
    """The "train", "dev" and "test" datasets of ``cfg``; cached under ``cache_dir`` if given."""
    if cache_dir is None:
        return _generate(cfg)
    path = cache_path(cfg, Path(cache_dir))
    if path.exists():
        loaded = _load(cfg, path)
        if loaded is not None:
            return loaded
    out = _generate(cfg)
    tensors = {f"{s}/{k}": v for s, ds in out.items() for k, v in ds.tensors().items()}
    meta = {
        "config_hash": config_hash(cfg),
        "config": json.dumps(cfg.model_dump(mode="json")),
        "format_version": str(FORMAT_VERSION),
    }
    atomic_save_safetensors(path, tensors, metadata=meta)
    return out
