"""Turn pydantic's errors into :class:`trainjob.errors.ValidationError` with Kubernetes-style field paths.

>>> from trainjob.api import TrainJob
>>> TrainJob.from_dict({"metadata": {"name": "a"},
...                     "spec": {"runtimeRef": {"name": "r"}, "trainer": {"numNodes": 0}}})
Traceback (most recent call last):
...
trainjob.errors.ValidationError: spec.trainer.numNodes: must be >= 1, got 0
"""

from __future__ import annotations

import types
import typing
from typing import Any, TypeVar

import pydantic

from trainjob.errors import ValidationError

M = TypeVar("M", bound=pydantic.BaseModel)

_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "float_type": "a number",
}


def format_path(loc: tuple[int | str, ...]) -> str:
    """``("spec", "trainer", "env", 0, "name")`` -> ``spec.trainer.env[0].name``; map keys with dots or slashes
    are bracketed: ``requests[nvidia.com/gpu]``."""
    out = ""
    for part in loc:
        if isinstance(part, int) or "." in part or "/" in part:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validate_model(model: type[M], data: Any) -> M:
    """``model.model_validate(data)``, raising :class:`ValidationError` (every problem, one per line)."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = [_translate(model, err) for err in exc.errors(include_url=False)]
        raise ValidationError.combine(errors) from None


def _translate(model: type[pydantic.BaseModel], err: Any) -> ValidationError:
    loc = tuple(err["loc"])
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        accepted = ", ".join(_aliases(parent)) if parent else ""
        message = f"unknown field {loc[-1]!r}" + (f"; accepted fields: {accepted}" if accepted else "")
        return ValidationError(format_path(loc), message)
    if kind == "missing":
        message = "required field is missing"
    elif kind == "greater_than_equal":
        message = f"must be >= {ctx['ge']}, got {value!r}"
    elif kind == "less_than_equal":
        message = f"must be <= {ctx['le']}, got {value!r}"
    elif kind in ("string_too_short", "too_short") and ctx.get("min_length") == 1:
        message = f"must not be empty, got {value!r}"
    elif kind == "literal_error":
        message = f"must be {ctx['expected']}, got {value!r}"
    elif kind == "string_pattern_mismatch":
        message = f"must match {ctx['pattern']}, got {value!r}"
    elif kind in _TYPE_NAMES:
        message = f"must be {_TYPE_NAMES[kind]}, got {value!r}"
    elif kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
    else:
        message = f"{err['msg'][:1].lower()}{err['msg'][1:]}, got {value!r}"
    return ValidationError(format_path(loc), message)


def _aliases(model: type[pydantic.BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_at(model: type[pydantic.BaseModel], loc: tuple[int | str, ...]) -> type[pydantic.BaseModel] | None:
    """The model class found at ``loc`` inside ``model`` (through lists, dicts and optionals), if any."""
    current: Any = model
    for part in loc:
        current = _unwrap(current, container_item=isinstance(part, int))
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, pydantic.BaseModel)):
            return None
        field = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        current = field.annotation
    current = _unwrap(current, container_item=False)
    return current if isinstance(current, type) and issubclass(current, pydantic.BaseModel) else None


def _unwrap(annotation: Any, *, container_item: bool) -> Any:
    """Strip ``Optional`` / ``Annotated``; for list items (``container_item``) step into ``list[X]``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = members[0] if len(members) == 1 else annotation
            if len(members) != 1:
                return annotation
        elif container_item and origin is list:
            annotation = typing.get_args(annotation)[0]
            container_item = False
        else:
            return annotation
