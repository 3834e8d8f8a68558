"""One-line, field-naming errors for bad input, shared by every stage."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """Bad user input. Its message is one line that names the field and what was expected."""


class DamagedFile(ConfigError):
    """A file mecheval wrote that cannot be read back (truncated, garbage, another format).
    Its message names the file."""


def first_line(err: BaseException) -> str:
    """An exception's message cut to its first line (its type where it has none)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def describe(err: ValidationError, prefix: str = "") -> str:
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"] if part != "__root__")
    field = ".".join(p for p in (prefix, loc) if p) or prefix or "config"
    # pydantic prefixes the message of a ValueError raised in a validator; it says nothing.
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif "input" in first and first["type"] not in ("missing",):
        msg = f"{msg} (got {first['input']!r})"
    more = len(err.errors()) - 1
    return f"{field}: {msg}" + (f" (+{more} more)" if more > 0 else "")


def validate(model_cls: type[M], data: Any, prefix: str = "") -> M:
    """Validate ``data`` into ``model_cls``; raise :class:`ConfigError` with a one-line message."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe(err, prefix)) from None
