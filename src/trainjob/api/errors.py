"""Turn pydantic's errors into :class:`trainjob.errors.ValidationError` with Kubernetes-style field paths.

>>> from trainjob.api import TrainJob
>>> TrainJob.from_dict({"metadata": {"name": "a"},
...                     "spec": {"runtimeRef": {"name": "r"}, "trainer": {"numNodes": 0}}})
Traceback (most recent call last):
...
trainjob.errors.ValidationError: spec.trainer.numNodes: must be >= 1, got 0
"""

from __future__ import annotations

import reprlib
import types
import typing
from typing import Any, TypeVar

import pydantic

from trainjob.api.limits import check_data
from trainjob.errors import ValidationError

M = TypeVar("M", bound=pydantic.BaseModel)

#: Longest quoted value in an error message; a longer ``repr`` is cut and marked with ``...``.
MAX_QUOTED_CHARS = 80
#: Longest map key shown in a field path (``labels[...]``).
MAX_PATH_KEY_CHARS = 40
#: Most problems listed for one input; a last line counts the rest (a bad list of 10^5 items gives 21 lines).
MAX_REPORTED_PROBLEMS = 20
#: Integers with more bits than this are described by their size, not printed (Python refuses to print
#: integers of more than 4,300 digits at all).
_MAX_PRINTED_INT_BITS = 256

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


class _ShortRepr(reprlib.Repr):
    """``reprlib`` with small limits, so quoting a huge or deeply nested value costs little."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = self.maxlong = limit
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = self.maxarray = 6
        self.maxdict = 4

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _MAX_PRINTED_INT_BITS:
            return f"<an integer of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


def quote(value: Any, limit: int = MAX_QUOTED_CHARS) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters; whatever the input, it is cheap.

    >>> quote("abc"), quote(["a"] * 100)
    ("'abc'", "['a', 'a', 'a', 'a', 'a', 'a', ...]")
    >>> len(quote("x" * 10**6)), quote(10**5000)
    (80, '<an integer of about 5001 digits>')
    """
    text = _ShortRepr(limit).repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shorten(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``text`` cut to ``limit`` characters (ending in ``...`` when cut)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_path(loc: tuple[int | str, ...]) -> str:
    """``("spec", "trainer", "env", 0, "name")`` -> ``spec.trainer.env[0].name``; map keys with dots or slashes
    are bracketed: ``requests[nvidia.com/gpu]``; keys that are long or not printable are quoted and cut."""
    out = ""
    for part in loc:
        if isinstance(part, int) or part == "[key]":
            out += f"[{part}]" if isinstance(part, int) else part
        elif len(part) > MAX_PATH_KEY_CHARS or not part.isprintable() or not part or " " in part:
            out += f"[{quote(part, MAX_PATH_KEY_CHARS)}]"
        elif "." in part or "/" in part or "[" in part:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def combine(errors: list[ValidationError]) -> ValidationError:
    """One error holding ``errors`` (each one line), the first :data:`MAX_REPORTED_PROBLEMS` of them listed and
    the rest counted."""
    flat = [leaf for err in errors for leaf in err.errors]
    if len(flat) > MAX_REPORTED_PROBLEMS:
        hidden = len(flat) - MAX_REPORTED_PROBLEMS
        flat = [*flat[:MAX_REPORTED_PROBLEMS], ValidationError("", f"... and {hidden} more problem(s)")]
    return ValidationError.combine(flat)


def validate_model(model: type[M], data: Any) -> M:
    """``model.model_validate(data)``, raising :class:`ValidationError` (every problem, one per line); ``data``
    is held to :mod:`trainjob.api.limits` first."""
    check_data(data)
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = [e for err in exc.errors(include_url=False) for e in _translate(model, err)]
        raise combine(errors) from None


def _translate(model: type[pydantic.BaseModel], err: Any) -> list[ValidationError]:
    loc = tuple(err["loc"])
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "value_error" and isinstance(ctx.get("error"), ValidationError):
        # A validator that checks a nested shape itself (e.g. a runtime's pod template): its paths continue ours.
        return [_nested(format_path(loc), inner) for inner in ctx["error"].errors]
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        accepted = ", ".join(_aliases(parent)) if parent else ""
        message = f"unknown field {quote(loc[-1])}" + (f"; accepted fields: {accepted}" if accepted else "")
        return [ValidationError(format_path(loc), message)]
    if kind == "missing":
        message = "required field is missing"
    elif kind == "greater_than_equal":
        message = f"must be >= {ctx['ge']}, got {quote(value)}"
    elif kind == "less_than_equal":
        message = f"must be <= {ctx['le']}, got {quote(value)}"
    elif kind in ("string_too_short", "too_short") and ctx.get("min_length") == 1:
        message = f"must not be empty, got {quote(value)}"
    elif kind == "literal_error":
        message = f"must be {ctx['expected']}, got {quote(value)}"
    elif kind == "string_pattern_mismatch":
        message = f"must match {ctx['pattern']}, got {quote(value)}"
    elif kind in _TYPE_NAMES:
        message = f"must be {_TYPE_NAMES[kind]}, got {quote(value)}"
    elif kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
    else:
        message = f"{err['msg'][:1].lower()}{err['msg'][1:]}, got {quote(value)}"
    return [ValidationError(format_path(loc), shorten(message, 4 * MAX_QUOTED_CHARS))]


def _nested(prefix: str, inner: ValidationError) -> ValidationError:
    if not inner.path:
        return ValidationError(prefix, inner.message)
    joiner = "" if inner.path.startswith("[") or not prefix else "."
    return ValidationError(f"{prefix}{joiner}{inner.path}", inner.message)


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
