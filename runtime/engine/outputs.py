"""What the engine streams back for each request after each step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class RequestOutput:
    """An increment: the text and token ids produced since this request's previous output."""

    request_id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # "stop" (EOS, stop token or stop string) or "length"
    usage: Usage | None = None

    def then(self, later: RequestOutput) -> RequestOutput:
        """This increment followed by a later one of the same request, as one increment."""
        return RequestOutput(self.request_id, self.text + later.text,
                             self.token_ids + later.token_ids, later.finished,
                             later.finish_reason, later.usage)
