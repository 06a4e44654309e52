"""The project as a Dagster component: ``cdc_assets.CdcComponent``, declared in a ``defs.yaml``.

Its attributes are the pipeline config's fields (``kafka``, ``delta``, ``connectors``, ``spark``,
``batch``, ...), validated as ``CDC_ASSETS_CONFIG``'s file is, with errors naming the ``defs.yaml``, the
line and the field. ``translation`` changes how each table appears in Dagster, as dagster-sling's does
(the template scope has ``table``, a ``CapturedTable``, and ``spec``, the default ``AssetSpec``), and
Dagster's own ``post_processing`` applies to the assets it builds::

    type: cdc_assets.CdcComponent
    attributes:
      kafka:
        bootstrap_servers: "{{ env.CDC_KAFKA_BOOTSTRAP_SERVERS }}"
      delta:
        root: /data/delta
      connectors:
        - name: inventory
          kind: postgresql
          topic.prefix: inventory
          tables:
            - name: public.customers
      translation:
        group_name: "bronze_{{ table.connector }}"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import yaml
from dagster import (
    AssetKey,
    AssetSpec,
    AutomationCondition,
    ComponentLoadContext,
    Definitions,
    FreshnessPolicy,
    Model,
    Resolvable,
    Resolver,
    StateBackedComponent,
)
from dagster.components import DefsStateConfig, DefsStateConfigArgs, ResolvedDefsStateConfig
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import BaseModel, PrivateAttr
from pydantic.fields import FieldInfo
from typing_extensions import Self

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import PipelineConfig, validate_config, with_fields_of
from cdc_assets.translator import CdcTranslator

_COMPONENT_TYPES = ("cdc_assets.CdcComponent", "cdc_assets.component.CdcComponent")


class TranslatedCdcTranslator(CdcTranslator):
    """``CdcTranslator`` with a component's ``translation`` applied to each table's default spec."""

    def __init__(self, translation: TranslationFn[CapturedTable]):
        self._translation = translation
        self._specs: dict[tuple[str, str], AssetSpec] = {}

    def _spec(self, table: CapturedTable) -> AssetSpec:
        known = self._specs.get((table.connector, table.name))
        if known is None:
            default = AssetSpec(super().get_asset_key(table), group_name=super().get_group_name(table),
                                description=super().get_description(table), metadata=super().get_metadata(table),
                                owners=super().get_owners(table), tags=super().get_tags(table),
                                freshness_policy=super().get_freshness_policy(table),
                                automation_condition=super().get_automation_condition(table))
            known = self._specs[(table.connector, table.name)] = self._translation(default, table)
        return known

    def get_asset_key(self, table: CapturedTable) -> AssetKey:
        return self._spec(table).key

    def get_group_name(self, table: CapturedTable) -> str:
        return self._spec(table).group_name or super().get_group_name(table)

    def get_owners(self, table: CapturedTable) -> list[str]:
        return list(self._spec(table).owners)

    def get_tags(self, table: CapturedTable) -> dict[str, str]:
        return dict(self._spec(table).tags)

    def get_description(self, table: CapturedTable) -> str:
        return self._spec(table).description or ""

    def get_metadata(self, table: CapturedTable) -> dict[str, Any]:
        return dict(self._spec(table).metadata)

    def get_freshness_policy(self, table: CapturedTable) -> FreshnessPolicy | None:
        return self._spec(table).freshness_policy

    def get_automation_condition(self, table: CapturedTable) -> AutomationCondition | None:
        return self._spec(table).automation_condition


def _as_written(field: FieldInfo) -> Any:
    """A pipeline config ``field`` as an attribute taken as written (templates rendered), with the field's
    description: its YAML schema takes any value, so that ``dg``'s schema check leaves the validation to
    ``pipeline_config``, whose errors name the defs.yaml's line and the field."""
    return Annotated[Any, Resolver(lambda context, value: context.resolve_value(value), model_field_type=Any,
                                   description=field.description)]


@with_fields_of(PipelineConfig, _as_written)
class CdcComponent(StateBackedComponent, Resolvable, Model):
    """Debezium topics kept in step with Delta tables: the assets, checks, jobs, schedules, sensors and
    resources that ``build_definitions`` makes of a pipeline config, from a ``defs.yaml``'s attributes.

    State-backed: the broker's topics, which the connectors' ``include`` patterns are matched against, are
    its state (``defs_state``; by default listed once when the code server starts and handed to each run
    from there, so a run worker's load asks the broker nothing). Without include patterns the state is
    empty and no broker is asked.

    Its attributes besides ``translation`` and ``defs_state`` are ``PipelineConfig``'s fields, declared there
    only (``with_fields_of``)."""

    translation: Annotated[TranslationFn[CapturedTable],
                           TranslationFnResolver[CapturedTable](lambda table: {"table": table})] | None = None
    defs_state: ResolvedDefsStateConfig = DefsStateConfigArgs.legacy_code_server_snapshots()
    _source: Path | None = PrivateAttr(default=None)  # the defs.yaml it was declared in (errors name its lines)

    @classmethod
    def load(cls, attributes: BaseModel | None, context: ComponentLoadContext) -> Self:
        """The component of a ``defs.yaml``'s attributes, remembering the file for its errors."""
        component = super().load(attributes, context)
        source = context.path / "defs.yaml" if context.path.is_dir() else context.path
        component._source = source if source.is_file() else None
        return component

    @property
    def defs_state_config(self) -> DefsStateConfig:
        """Where the topics are kept: ``defs_state``, under a key naming the connectors."""
        names = ",".join(str(connector.get("name")) for connector in vars(self)["connectors"])
        return DefsStateConfig.from_args(self.defs_state, default_key=f"CdcComponent[{names}]")

    def write_state_to_path(self, state_path: Path) -> None:
        """The broker's topics as JSON, if a connector has include patterns (else none, and no broker asked)."""
        from cdc_assets.definitions import broker_topics

        config = self.pipeline_config()
        topics = broker_topics(config) if any(connector.include for connector in config.connectors) else []
        state_path.write_text(json.dumps(topics))

    def pipeline_config(self) -> PipelineConfig:
        """The attributes as a validated pipeline config; errors name the ``defs.yaml``'s lines when the
        component was loaded from one."""
        data = {name: value for name in PipelineConfig.model_fields
                if name in self.model_fields_set and (value := getattr(self, name)) is not None}
        return validate_config(data, str(self._source or "<component>"), *_attributes_node(self._source))

    def build_defs_from_state(self, context: ComponentLoadContext, state_path: Path | None) -> Definitions:
        """``build_definitions`` of the attributes, with the ``translation`` if any, and the topics of the
        state (none written yet: the broker is asked now, if include patterns need it)."""
        from cdc_assets.definitions import build_definitions

        translator = TranslatedCdcTranslator(self.translation) if self.translation is not None else None
        topics = json.loads(state_path.read_text()) if state_path is not None and state_path.exists() else None
        return build_definitions(self.pipeline_config(), translator, topics)


def _attributes_node(source: Path | None) -> tuple[yaml.Node | None, tuple[str, ...]]:
    """The YAML node of the component's document in ``source`` and the path to its attributes (for
    errors' line numbers); none when there is no file or no such document."""
    if source is None:
        return None, ()
    try:
        documents = list(yaml.compose_all(source.read_text()))
    except (OSError, yaml.YAMLError):
        return None, ()
    for document in documents:
        if isinstance(document, yaml.MappingNode) and any(
                key.value == "type" and getattr(value, "value", None) in _COMPONENT_TYPES
                for key, value in document.value):
            return document, ("attributes",)
    return None, ()
