"""A text request's prompt: `prompt` or `messages`, `raw`, and how it becomes token ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgefire.runtime.errors import ContextLengthError, InvalidInputError
from edgefire.runtime.server.inputs import given
from edgefire.runtime.tokenizer import Tokenizer


@dataclass(slots=True, frozen=True)
class PromptInput:
    prompt: str | None = None  # exactly one of prompt and messages is set
    messages: list[dict[str, Any]] | None = None
    raw: bool = False  # skip the chat template


def prompt_input(body: dict[str, Any], *, allow_prompt: bool = True) -> PromptInput:
    """The prompt fields of a body the schema passed (OpenAI bodies have no `prompt`)."""
    raw = given(body, "raw", False)
    prompt = given(body, "prompt") if allow_prompt else None
    messages = given(body, "messages")
    if prompt is not None:
        # Cross-field: the Prompt variant lets other keys through, as Workers AI's schema does.
        if messages is not None:
            raise InvalidInputError("prompt cannot be given with messages", field="prompt")
        return PromptInput(prompt=prompt, raw=raw)
    return PromptInput(messages=[{**m, "content": _text(m.get("content"))} for m in messages],
                       raw=raw)


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
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)



def _text(content: str | list[dict[str, Any]] | None) -> str:
    """A message's content as text: its text parts joined; none for a tool-call turn."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)
