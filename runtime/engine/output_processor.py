"""Incremental detokenization and stop-string handling, per request.

Text that could be the start of a stop string is held back until it is known not to be one,
so a stream never shows text that the final answer would cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefire.runtime.engine.outputs import RequestOutput, Usage
from edgefire.runtime.engine.sequence import Sequence
from edgefire.runtime.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(slots=True)
class _TextState:
    detokenizer: IncrementalDetokenizer
    text: str = ""
    num_emitted_chars: int = 0


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, _TextState] = {}

    def add(self, seq: Sequence) -> None:
        self.states[seq.request_id] = _TextState(IncrementalDetokenizer(
            self.tokenizer, seq.token_ids[:seq.num_prompt_tokens]))

    def remove(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def update(self, seq: Sequence, token_id: int, finish_reason: str | None) -> RequestOutput:
        """Fold in seq's newest token; returns the increment, with finish_reason if it ended."""
        state = self.states[seq.request_id]
        state.text += state.detokenizer.push(token_id)
        stops = seq.params.stop
        if finish_reason is not None:
            state.text += state.detokenizer.flush()
        if stops:
            # Only the new tail can complete a stop string; search from just before it.
            start = max(0, state.num_emitted_chars - max(map(len, stops)))
            cut = min((i for s in stops if (i := state.text.find(s, start)) >= 0), default=-1)
            if cut >= 0:
                state.text = state.text[:cut]
                finish_reason = "stop"
        finished = finish_reason is not None
        end = len(state.text)
        if not finished and stops:
            end = max(state.num_emitted_chars, end - (max(map(len, stops)) - 1))
        delta = state.text[state.num_emitted_chars:end]
        state.num_emitted_chars = end
        usage = None
        if finished:
            self.remove(seq.request_id)
            usage = Usage(seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_tokens)
        return RequestOutput(seq.request_id, delta, [token_id], finished, finish_reason, usage)
