"""A config model's fields declared on another pydantic class (a resource, the dg component), and read back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

_Section = TypeVar("_Section", bound=BaseModel)
_Declaring = TypeVar("_Declaring", bound=BaseModel)


def with_fields_of(model: type[BaseModel], annotate: Callable[[FieldInfo], Any] = lambda field: field.annotation
                   ) -> Callable[[type[_Declaring]], type[_Declaring]]:
    """A class decorator: the decorated pydantic class (a Dagster resource, its config, the dg component) with
    ``model``'s fields added as its own, by name, type (``annotate`` of the field), default and description,
    so that a setting is declared once, in its config model here, and shown with its description wherever it
    is set. The validators stay the model's: ``as_section`` rebuilds it from a declaring object."""

    def declare(cls: type[_Declaring]) -> type[_Declaring]:
        fields: dict[str, Any] = {}
        for name, field in model.model_fields.items():
            default: dict[str, Any] = ({"default_factory": field.default_factory} if field.default_factory
                                       else {} if field.is_required() else {"default": field.default})
            fields[name] = (annotate(field), Field(description=field.description, **default))
        declared = create_model(cls.__name__, __base__=cls, __module__=cls.__module__, __doc__=cls.__doc__,
                                **fields)
        declared.__qualname__ = cls.__qualname__
        return declared

    return declare


def as_section(declaring: BaseModel, model: type[_Section]) -> _Section:
    """The config ``model`` whose fields ``declaring`` took by ``with_fields_of``, as it holds them (validated
    once, when the pipeline config was loaded, not again on each use)."""
    return model.model_construct(**{name: getattr(declaring, name) for name in model.model_fields})
