"""Per-request sampling parameters, mirroring Workers AI text-generation inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgefire.contract.errors import InvalidInputError

MAX_SEED = 2**63 - 1
# OpenAI's limit on stop sequences. Each one's length bounds how much text a stream holds back
# (it could be the start of a stop string) and what every new token rescans; 256 characters
# is far beyond a real stop marker (`</answer>`, a chat turn tag) and keeps both small.
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256


@dataclass(slots=True)
class SamplingParams:
    """Defaults follow Workers AI (max_tokens 256, temperature 0.6); temperature 0 is greedy."""

    max_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # Structured output: the answer is one JSON value valid against this schema ({"type":
    # "object"} for plain JSON mode), enforced token by token (runtime/engine/structured.py).
    json_schema: dict | None = None
    json_schema_field: str = "response_format"  # the input it came from, for error messages
    # Engine API only (not a Workers AI input): run this request deterministically whatever the
    # node's policy. Over HTTP the node's EDGEFIRE_DETERMINISTIC policy decides.
    deterministic: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def validate(self, vocab_size: int) -> None:
        """Raise InvalidInputError naming the first field that is out of range."""
        _check(_integer(self.max_tokens) and self.max_tokens >= 1, "max_tokens",
               "must be an integer >= 1")
        _check(_number(self.temperature) and 0.0 <= self.temperature <= 5.0, "temperature",
               "must be between 0 and 5")
        _check(_number(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p",
               "must be in (0, 1]")
        _check(_integer(self.top_k) and 0 <= self.top_k <= vocab_size, "top_k",
               f"must be an integer between 0 and {vocab_size}")
        _check(self.seed is None or (_integer(self.seed) and 0 <= self.seed <= MAX_SEED),
               "seed", "must be a non-negative integer")
        _check(_number(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 2.0,
               "repetition_penalty", "must be in (0, 2]")
        _check(_number(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
               "frequency_penalty", "must be between -2 and 2")
        _check(_number(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
               "presence_penalty", "must be between -2 and 2")
        _check(isinstance(self.stop, list) and len(self.stop) <= MAX_STOP_STRINGS
               and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in self.stop),
               "stop", f"must be at most {MAX_STOP_STRINGS} non-empty strings of at most "
               f"{MAX_STOP_CHARS} characters")
        _check(self.json_schema is None or isinstance(self.json_schema, dict), "response_format",
               "json_schema must be a JSON Schema object")
        _check(isinstance(self.stop_token_ids, list)
               and all(_integer(t) and 0 <= t < vocab_size for t in self.stop_token_ids),
               "stop_token_ids", f"must be token ids below {vocab_size}")


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _check(ok: bool, name: str, rule: str) -> None:
    if not ok:
        raise InvalidInputError(f"{name} {rule}", field=name)
