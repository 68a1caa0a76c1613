"""Render a model's jinja chat template the way HF `apply_chat_template` does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgefire.contract.errors import InvalidInputError


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject conversations they cannot express (e.g. bad role order).
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators=None,
    sort_keys: bool = False,
) -> str:
    # jinja's built-in tojson HTML-escapes <, > and &, which would corrupt prompts; HF overrides
    # it the same way.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _validate(messages: object) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError("messages must be a non-empty list", field="messages")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidInputError(f"{where} must be an object", field=where)
        for key in ("role", "content"):
            if not isinstance(msg.get(key), str):
                raise InvalidInputError(f"{where}.{key} must be a string", field=f"{where}.{key}")
    return messages


class ChatTemplate:
    """A compiled chat template; `render` turns a message list into the prompt text."""

    __slots__ = ("source", "bos_token", "eos_token", "_template")

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        # Same environment settings as transformers, so whitespace renders identically.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"invalid chat template: {exc}") from exc

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render `messages`; a template rejection or malformed input is an InvalidInputError."""
        context: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "messages": _validate(messages),
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**context)
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidInputError(
                f"chat template rejected messages: {exc}", field="messages"
            ) from exc
        except (TypeError, KeyError, AttributeError, IndexError) as exc:
            raise InvalidInputError(
                f"chat template failed on messages: {exc}", field="messages"
            ) from exc
