"""How a text request's prompt (`prompt` or `messages`, `raw`) becomes token ids."""

from __future__ import annotations

from edgefire.contract.errors import ContextLengthError
from edgefire.contract.text_generation import PromptInput
from edgefire.runtime.tokenizer import Tokenizer


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
