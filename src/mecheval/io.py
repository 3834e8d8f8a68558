"""Atomic file writes shared by every stage.

Every file a stage leaves on disk is written to a temporary file in the same folder and then
renamed over the target (``os.replace`` is atomic on POSIX within one file system), so a
reader, or a run resumed after a crash, sees either the old file or the new one, never half
of one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once: os.umask can only be read by setting it, which races with other threads.
_UMASK = _read_umask()


#: PyYAML's loader on libyaml's parser where PyYAML was built with it (several times faster on
#: a sweep's hundreds of run configs; the same safe constructors, so the same values).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, on libyaml's parser where there is one."""
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            # fsync before the rename: otherwise a power loss can leave the new name
            # pointing at an empty file.
            os.fsync(handle.fileno())
        # mkstemp creates 0600; give the file the permissions an ordinary open() would.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    # allow_nan: a diverged run's metrics are NaN and must still be recordable.
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def atomic_write_csv(
    path: str | Path, header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> Path:
    """Write a whole CSV. Floats are written with ``repr`` so they round-trip bit for bit."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([repr(v) if isinstance(v, float) else v for v in row])
    return atomic_write_text(path, buffer.getvalue())


def atomic_save_safetensors(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Save tensors with safetensors (never pickle) through a temporary file."""
    from safetensors.torch import save

    # clone: safetensors refuses tensors that share storage (e.g. tied weights, views).
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    data = save(plain, metadata=dict(metadata) if metadata else None)
    return atomic_write_bytes(path, data)
