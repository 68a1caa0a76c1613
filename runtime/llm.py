"""Offline batch API in the style of vLLM: `LLM(model).generate(prompts, params)`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.engine.llm_engine import EngineConfig
from edgefire.runtime.engine.outputs import Usage
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.loading import build_engine


@dataclass(slots=True)
class GenerationResult:
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    usage: Usage | None


class LLM:
    def __init__(self, model: str, *, dtype: str | None = None,
                 engine_config: EngineConfig | None = None, catalog: Catalog | None = None):
        """dtype ("auto", "float32", "bfloat16") overrides engine_config.dtype."""
        spec = (catalog or Catalog.load()).get_runnable(model)
        config = engine_config or EngineConfig()
        if dtype is not None:
            config = replace(config, dtype=dtype)
        self.engine, loaded = build_engine(spec, config)
        self.model = loaded.model  # the CausalLM the engine runs (weight size and precision)
        self.tokenizer = loaded.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[GenerationResult]:
        """Run all prompts together in one continuous batch; results in prompt order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        token_lists = [p if isinstance(p, list) else self._encode(p) for p in prompts]
        return self._run(token_lists, params)

    def chat(self, conversations: list[list[dict]] | list[dict],
             params: SamplingParams | list[SamplingParams] | None = None,
             ) -> list[GenerationResult]:
        """Apply the model's chat template to each conversation, then generate."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        template = self.tokenizer.chat_template
        if template is None:
            raise InvalidInputError("this model has no chat template", field="messages")
        texts = [template.render(messages) for messages in conversations]
        return self._run([self.tokenizer.encode(t, add_special_tokens=False) for t in texts],
                         params)

    def _encode(self, text: str) -> list[int]:
        if not isinstance(text, str) or not text:
            raise InvalidInputError("prompt must be a non-empty string", field="prompt")
        return self.tokenizer.encode(text)

    def _run(self, token_lists: list[list[int]],
             params: SamplingParams | list[SamplingParams] | None) -> list[GenerationResult]:
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(token_lists)
        if len(params) != len(token_lists):
            raise InvalidInputError("one SamplingParams per prompt is required", field="params")
        ids = [f"offline-{next(self._ids)}" for _ in token_lists]
        results = {i: GenerationResult(t, "", [], None, None)
                   for i, t in zip(ids, token_lists, strict=True)}
        # Whatever fails (a bad request while adding, a failed step), the call's other
        # requests are aborted too, so the engine is left empty for the next call.
        try:
            for request_id, tokens, p in zip(ids, token_lists, params, strict=True):
                self.engine.add_request(request_id, tokens, p)
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    result = results[out.request_id]
                    result.text += out.text
                    result.token_ids.extend(out.token_ids)
                    if out.finished:
                        result.finish_reason, result.usage = out.finish_reason, out.usage
        except Exception:
            for request_id in ids:
                self.engine.abort(request_id)
            raise
        return [results[i] for i in ids]
