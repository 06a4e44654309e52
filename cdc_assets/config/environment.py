"""``${VAR}`` and ``${VAR:-default}`` in the config's strings: which variables each setting reads, and
their values put in."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

_ENV_REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def env_references(value: Any, path: str = "") -> dict[str, tuple[str, ...]]:
    """The ``${VAR}`` references of each string setting, by its dotted path (list items by index)."""
    if isinstance(value, str):
        names = tuple(match.group("name") for match in _ENV_REFERENCE.finditer(value))
        return {path: names} if names else {}
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    found: dict[str, tuple[str, ...]] = {}
    for key, item in items:
        found.update(env_references(item, f"{path}.{key}" if path else str(key)))
    return found


def interpolate_env(value: Any) -> Any:
    """``value`` with each ``${VAR}`` in its strings replaced by the variable's value (or the default given);
    ``KeyError`` names a variable that is not set and has no default."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group("name"), match.group("default")
            if name in os.environ:
                return os.environ[name]
            if default is None:
                raise KeyError(f"environment variable {name} is not set (referenced as ${{{name}}})")
            return default

        return _ENV_REFERENCE.sub(substitute, value)
    if isinstance(value, Mapping):
        return {key: interpolate_env(item) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate_env(item) for item in value]
    return value
