"""The base of every request body (_Body: strict, a null taken as the default, lists bounded before
their items are validated) and how a body's own checks name their field and code (field_error, coded)."""

from __future__ import annotations

from functools import cache
from typing import ClassVar, get_args

from annotated_types import MaxLen
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

# lists and maps of bodies' fields, bounded before their items are validated
BOUNDED = ("messages", "content", "tool_calls", "tools", "functions", "tokens", "prompt", "logit_bias", "metadata")


def field_error(
    model: type, where: tuple, message: str, value: object = None, kind: str = "value_error"
) -> ValidationError:
    """A check across fields (a model validator's) refused in the name of the field ``where`` (the
    error body's ``param``), as a field's own check is; ``kind`` as in ``coded``."""
    error = PydanticCustomError(kind, "{message}", {"message": message})
    return ValidationError.from_exception_data(model.__name__, [InitErrorDetails(type=error, loc=where, input=value)])


class _Body(BaseModel):
    # "max_tokens": "4" is refused, not coerced; NaN and infinities are refused as not finite
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    list_limits: ClassVar[dict[str, int]] = {}  # a list field's bound where its max_length is another's

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: object) -> object:
        """A field given as null takes its default (OpenAI declares its optional fields nullable); a
        required one keeps it, refused as of the wrong type (OpenAI's invalid_type: "expected a string,
        got null"; it was told missing, as if left out). An integer field takes an integral number
        written as 16.0 (JSON has one number type: JSON Schema's integer admits it, as OpenAI and vLLM
        do), not 16.5 nor "16"."""
        if not isinstance(data, dict):
            return data
        required, integers = _required(cls), _integers(cls)
        return {
            k: int(v) if k in integers and isinstance(v, float) and v.is_integer() else v
            for k, v in data.items()
            if v is not None or k in required
        }

    @field_validator(*BOUNDED, mode="before", check_fields=False)
    @classmethod
    def _not_too_many(cls, value: object, info: ValidationInfo) -> object:
        """A list or map longer than its field takes is refused before its items are validated:
        pydantic checks a list's max_length after them (2 M one-token prompts, 190 k content parts:
        seconds of the event loop each); a map's, told with its count in properties, as OpenAI's API
        tells it (code object_above_max_properties: it was a list's, array_above_max_length)."""
        if isinstance(value, list | dict) and info.field_name is not None:
            field = cls.model_fields[info.field_name]
            limit = cls.list_limits.get(info.field_name)
            limit = limit or next((m.max_length for m in field.metadata if isinstance(m, MaxLen)), None)
            if limit is not None and len(value) > limit and isinstance(value, dict):
                raise PydanticCustomError(
                    "too_many_properties",
                    "at most {limit} properties, not {count}",
                    {"limit": limit, "count": len(value)},
                )
            if limit is not None and len(value) > limit:
                raise coded("too_long", f"at most {limit} items, not {len(value)}")
        return value


def coded(kind: str, message: str) -> PydanticCustomError:
    """A check of the field's own refused as pydantic's error type ``kind``, which error_fields codes:
    ``too_long`` (a list past its bound: array_above_max_length), ``unsupported_parameter``,
    ``unsupported_value``, ``invalid_type`` (a ValueError's code: invalid_value)."""
    return PydanticCustomError(kind, "{message}", {"message": message})


@cache
def _required(model: type[BaseModel]) -> frozenset[str]:
    """The body's keys (fields' names and aliases) that name a field without a default: read once a
    model (a scan of its fields for each null key sent took ~7 us: 600 k null keys in 10 MB, 4.5 s)."""
    return frozenset(key for name, f in model.model_fields.items() if f.is_required() for key in (name, f.alias) if key)


@cache
def _integers(model: type[BaseModel]) -> frozenset[str]:
    """The body's fields that take an integer: read once a model (``model_fields``, a property, was
    read for each key holding an integral float: 300 k unknown keys holding 1.0, 0.2 s)."""
    fields = model.model_fields.items()
    return frozenset(name for name, f in fields if f.annotation is int or int in get_args(f.annotation))
