"""The record format of a connector's topics, and the schema registry an Avro connector's schemas are in."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from cdc_assets.config.base import ConfigModel

RecordFormat = Literal["json", "avro"]


class SchemaRegistryConfig(ConfigModel):
    """The schema registry an Avro connector's converter registers its schemas in (Confluent's, or one with
    its API: Apicurio's ``/apis/ccompat/v7``). Secrets are named by environment variable, never inline."""

    url: str = Field(pattern=r"^https?://\S+$", description="the registry's Confluent-compatible API, "
                                                              "e.g. http://registry:8080/apis/ccompat/v7")
    basic_auth_user_env: str | None = Field(default=None, description="env var with the basic-auth user")
    basic_auth_password_env: str | None = Field(default=None, description="env var with the basic-auth password")
    ssl_ca_location: str | None = Field(default=None, description="CA certificate file (PEM) of an https registry")

    @model_validator(mode="after")
    def _auth_pairs(self) -> SchemaRegistryConfig:
        if (self.basic_auth_user_env is None) != (self.basic_auth_password_env is None):
            raise ValueError("basic auth needs both basic_auth_user_env and basic_auth_password_env")
        if self.ssl_ca_location is not None:
            if not self.url.startswith("https://"):
                raise ValueError(f"ssl_ca_location is for an https:// registry, url is '{self.url}'")
            if not Path(self.ssl_ca_location).is_file():
                raise ValueError(f"ssl_ca_location '{self.ssl_ca_location}' is not a readable file")
        return self
