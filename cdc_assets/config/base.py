"""What every part of the pipeline config shares: its error and its models' base (frozen, no unknown field)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """The pipeline config is not valid; the message names file, line and field."""


class ConfigModel(BaseModel):
    """A section of the pipeline config: frozen, and refusing a field it does not know."""

    model_config = ConfigDict(extra="forbid", frozen=True)
