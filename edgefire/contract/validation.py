"""Checking JSON values against the schemas: a compiled validator, and its first error said as
an InvalidInputError (5006) that names the field by its path, e.g. `messages[0].role`.

Messages are written from the error's kind, never from the value: a value can be a megabyte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jsonschema_rs

from edgefire.contract.errors import InvalidInputError

_Kind = jsonschema_rs.ValidationErrorKind
_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "a boolean", "object": "an object", "array": "an array",
               "null": "null"}


class Checker:
    """A schema compiled once; `check(value)` returns value or raises InvalidInputError."""

    __slots__ = ("schema", "_validator")

    def __init__(self, schema: dict) -> None:
        self.schema = schema
        self._validator = jsonschema_rs.Draft202012Validator(schema)

    def check(self, value: Any) -> Any:
        for error in self._validator.iter_errors(value):
            field, rule = _explain(error, self.schema)
            raise InvalidInputError(f"{field} {rule}", field=field)
        return value


def field_name(path: Sequence[str | int]) -> str:
    """`messages[0].role` for ["messages", 0, "role"]; `body`, `body[0]` in a bare value."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return text.lstrip(".") if path and isinstance(path[0], str) else f"body{text}"


def _explain(error: jsonschema_rs.ValidationError, root: dict) -> tuple[str, str]:
    """(field, rule) for the error, descending into the one/anyOf branch the value meant."""
    path, kind = list(error.instance_path), error.kind
    if isinstance(kind, _Kind.Required):
        return field_name([*path, kind.property]), "is required"
    if isinstance(kind, _Kind.AdditionalProperties):
        return field_name([*path, kind.unexpected[0]]), "is not a known field"
    if isinstance(kind, _Kind.OneOfNotValid | _Kind.AnyOf | _Kind.OneOfMultipleValid):
        return _explain_branches(error, _node(root, error.schema_path), root)
    if isinstance(kind, _Kind.Pattern):  # a regex says little to a user; its description more
        described = _node(root, error.schema_path).get("description")
        return field_name(path), f"must be {described}" if described else _rule(kind)
    return field_name(path), _rule(kind)


def _explain_branches(error: jsonschema_rs.ValidationError, node: dict,
                      root: dict) -> tuple[str, str]:
    branches = node.get("oneOf") or node.get("anyOf")
    path, value = list(error.instance_path), error.instance
    # Variants told apart by a required key (a prompt or messages): the one the value names.
    keys = [(b.get("required") or [None])[0] for b in branches]
    if isinstance(value, dict) and all(keys):
        named = [i for i, key in enumerate(keys) if value.get(key) is not None]
        if len(named) > 1:
            return field_name([*path, keys[named[0]]]), (
                f"cannot be given with {' or '.join(keys[i] for i in named[1:])}")
        if not named:
            return field_name([*path, keys[-1]]), f"or {' or '.join(keys[:-1])} is required"
        if error.kind.context[named[0]]:
            return _explain(error.kind.context[named[0]][0], root)
    # Variants told apart by type (a string or an array of them): the one of the value's type.
    if isinstance(error.kind, _Kind.OneOfNotValid | _Kind.AnyOf):
        fitting = [errors for errors in error.kind.context
                   if not any(isinstance(e.kind, _Kind.Type)
                              and list(e.instance_path) == path for e in errors)]
        if len(fitting) == 1:
            return _explain(fitting[0][0], root)
    kinds = [_describe(b) for b in branches if b.get("type") != "null"]
    described = node.get("description") or _or(kinds)
    return field_name(path), f"must be {described}"


def _rule(kind: object) -> str:
    if isinstance(kind, _Kind.Type):
        types = [t for t in kind.types if t != "null"] or ["null"]
        return f"must be {_or(_TYPE_NAMES[t] for t in types)}"
    if isinstance(kind, _Kind.Minimum | _Kind.Maximum | _Kind.ExclusiveMinimum
                  | _Kind.ExclusiveMaximum):
        sign = {_Kind.Minimum: ">=", _Kind.Maximum: "<=", _Kind.ExclusiveMinimum: ">",
                _Kind.ExclusiveMaximum: "<"}[type(kind)]
        return f"must be {sign} {kind.limit}"
    if isinstance(kind, _Kind.MinLength):
        return "must not be empty" if kind.limit == 1 else (
            f"must be at least {kind.limit} characters")
    if isinstance(kind, _Kind.MaxLength):
        return f"must be at most {kind.limit} characters"
    if isinstance(kind, _Kind.MinItems):
        return f"must have at least {kind.limit} item{'s' * (kind.limit != 1)}"
    if isinstance(kind, _Kind.MaxItems):
        return f"must have at most {kind.limit} items"
    if isinstance(kind, _Kind.Enum):
        return f"must be {_or(repr(o) for o in kind.options if o is not None)}"
    if isinstance(kind, _Kind.Constant):
        return f"must be {kind.expected_value!r}"
    if isinstance(kind, _Kind.Pattern):
        return f"must match {kind.pattern}"
    return "is not valid"


def _node(root: dict, schema_path: Sequence[str | int]) -> dict:
    """The schema node holding the failed keyword."""
    node: Any = root
    for part in schema_path[:-1]:
        node = node[part]
    return node


def _describe(schema: dict) -> str:
    if "const" in schema:
        return repr(schema["const"])
    types = schema.get("type", "object")
    return _or(_TYPE_NAMES[t] for t in ([types] if isinstance(types, str) else types))


def _or(words: Any) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
