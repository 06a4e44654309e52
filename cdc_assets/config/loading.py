"""Reading the pipeline config: the file named by ``$CDC_ASSETS_CONFIG`` (or the demo's), its YAML, and
validation errors that name file, line and field."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cdc_assets.config.base import ConfigError
from cdc_assets.config.environment import env_references, interpolate_env
from cdc_assets.config.pipeline import PipelineConfig

CONFIG_ENV_VAR = "CDC_ASSETS_CONFIG"
DEMO_CONFIG_PATH = Path(__file__).parent.parent / "demo" / "pipeline.yaml"


def load_config(path: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """Load and validate the pipeline config (``path``, else ``$CDC_ASSETS_CONFIG``, else the demo)."""
    config_path = Path(path or os.environ.get(CONFIG_ENV_VAR) or DEMO_CONFIG_PATH)
    try:
        text = config_path.read_text()
    except OSError as exc:
        raise ConfigError(f"{config_path}: cannot read the pipeline config: {exc}") from exc
    return parse_config(text, source=str(config_path))


def parse_config(text: str, source: str = "<config>") -> PipelineConfig:
    """Validate config text; errors name ``source``, the line and the field."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    return validate_config(data, source, root)


def validate_config(data: Any, source: str, root: yaml.Node | None = None,
                    prefix: Sequence[str] = ()) -> PipelineConfig:
    """Validate config ``data`` read from ``source``, whose YAML node ``root`` (if known) gives the line of
    each error; ``prefix``: the fields above the config in that YAML (a component's ``attributes``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the pipeline config must be a mapping with kafka, delta, connectors")
    references = env_references(data)
    try:
        data = interpolate_env(data)
    except KeyError as exc:
        raise ConfigError(f"{source}: {exc.args[0]}") from exc
    try:
        config = PipelineConfig.model_validate(data)
        config._source, config._env_references = source, references
        return config
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            location = [*prefix, *error["loc"]]
            line = _line_of(root, location) if root is not None else None
            field = ".".join(str(part) for part in location) or "(top level)"
            where = f"line {line}" if line else "?"
            problems.append(f"{source}:{where}: {field}: {error['msg']}")
        raise ConfigError("invalid pipeline config:\n  " + "\n  ".join(problems)) from None


def _line_of(node: yaml.Node | None, location: list[Any]) -> int | None:
    """1-based line of the deepest YAML node along a pydantic error location."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in location:
        if isinstance(node, yaml.MappingNode):
            child = next((value for key, value in node.value if key.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        else:
            child = None
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line
