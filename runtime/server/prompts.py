"""A text request's prompt: `prompt` or `messages`, `raw`, and how it becomes token ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import ContextLengthError, InvalidInputError
from runtime.server.inputs import optional
from runtime.tokenizer import Tokenizer


@dataclass(slots=True, frozen=True)
class PromptInput:
    prompt: str | None = None  # exactly one of prompt and messages is set
    messages: list[dict[str, Any]] | None = None
    raw: bool = False  # skip the chat template


def prompt_input(body: dict[str, Any], *, allow_prompt: bool = True) -> PromptInput:
    """The prompt fields of a body, checked; InvalidInputError names the field at fault."""
    raw = optional(body, "raw", bool, False)
    if allow_prompt and body.get("prompt") is not None:
        if body.get("messages") is not None:
            raise InvalidInputError("give either prompt or messages, not both", field="prompt")
        prompt = optional(body, "prompt", str)
        if not prompt:
            raise InvalidInputError("prompt must not be empty", field="prompt")
        return PromptInput(prompt=prompt, raw=raw)
    if body.get("messages") is None:
        need = "prompt or messages is" if allow_prompt else "messages is"
        raise InvalidInputError(f"{need} required", field="messages")
    return PromptInput(messages=_messages(body["messages"]), raw=raw)


def encode_prompt(tokenizer: Tokenizer, request: PromptInput, max_model_len: int,
                  max_token_chars: int | None) -> list[int]:
    """Token ids to generate from; a bare prompt is templated as one user turn, as Workers AI.

    Blocking (a megabyte takes a third of a second): call it off the event loop. A text that
    cannot fit the context window is refused (3010) before it is tokenized, by its length:
    no token stands for more than max_token_chars characters (None: no such bound).
    """
    template = tokenizer.chat_template
    if request.raw or template is None:
        text = request.prompt
        if text is None:
            text = "\n".join(m["content"] for m in request.messages)
        add_special_tokens = True
    else:
        messages = request.messages or [{"role": "user", "content": request.prompt}]
        # The template writes any special tokens itself (as HF apply_chat_template assumes).
        text, add_special_tokens = template.render(messages), False
    # The rendered text, not the input: a template may trim or add text.
    if max_token_chars is not None:
        at_least = -(-len(text) // max_token_chars)
        if at_least >= max_model_len:
            raise ContextLengthError(
                f"prompt has at least {at_least} tokens; the model's context window is "
                f"{max_model_len} tokens", field="prompt")
    if not text.isascii():
        _check_unicode(text, "prompt" if request.messages is None else "messages")
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _check_unicode(text: str, field: str) -> None:
    # JSON may carry a lone surrogate ("\ud800"), which no UTF-8 tokenizer takes.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"{field} is not valid Unicode (it has a lone surrogate)",
                                field=field) from None


def _messages(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InvalidInputError("messages must be a non-empty array", field="messages")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidInputError(f"{where} must be an object", field=where)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidInputError(f"{where}.role must be a string", field=f"{where}.role")
        content = _content(message.get("content"), role, f"{where}.content")
        messages.append({**message, "content": content})
    return messages


def _content(value: object, role: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":  # an OpenAI tool-call turn has no text
        return ""
    if isinstance(value, list) and all(_is_text_part(part) for part in value):
        return "\n".join(part["text"] for part in value)
    raise InvalidInputError(f"{where} must be a string or an array of text parts",
                            field=where)


def _is_text_part(part: object) -> bool:
    return (isinstance(part, dict) and part.get("type") == "text"
            and isinstance(part.get("text"), str))
