"""OpenAI-compatible routes under `…/ai/v1/`: bare OpenAI bodies, no Cloudflare envelope."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator

import torch
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.served import TEXT_EMBEDDINGS, TEXT_GENERATION
from edgefire.runtime.server.catalog_api import openai_model_list
from edgefire.runtime.server.embedding import Embedder, as_texts
from edgefire.runtime.server.generation import (
    Completion,
    Generation,
    TextGenerator,
    per_choice,
    usage_json,
)
from edgefire.runtime.server.inputs import (
    find_model,
    given,
    read_json,
    reject_if_busy,
    sampling_params,
)
from edgefire.runtime.server.prompts import prompt_input
from edgefire.runtime.server.schemas import CHAT_COMPLETIONS_REQUEST, EMBEDDINGS_REQUEST
from edgefire.runtime.server.sse import EventStream
from edgefire.runtime.server.validation import Checker
from edgefire.runtime.weight_precision import PRECISION_HEADER
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_CHAT = Checker(CHAT_COMPLETIONS_REQUEST)
_EMBEDDINGS = Checker(EMBEDDINGS_REQUEST)


class OpenAIRoutes:
    def __init__(self, node: EdgeNode, text: TextGenerator, embedder: Embedder) -> None:
        self.node = node
        self.text = text
        self.embedder = embedder

    async def chat_completions(self, request: Request) -> Response:
        body = _CHAT.check(await read_json(request, self.node.settings.max_request_bytes))
        name = body["model"]
        spec = find_model(self.node.catalog, name, (TEXT_GENERATION,))
        prompt = prompt_input(body, allow_prompt=False)
        n = int(given(body, "n", 1))
        params = per_choice(sampling_params(body, ("max_completion_tokens", "max_tokens")), n)
        busy = reject_if_busy(body)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
        account_id = request.path_params["account_id"]
        if given(body, "stream", False):
            include_usage = given(given(body, "stream_options", {}), "include_usage", False)
            generation = await self.text.start(account_id, spec, prompt, params, busy)
            precision = generation.weight_precision
            head["system_fingerprint"] = fingerprint(precision)
            return EventStream(_chunks(generation, head, include_usage), generation.close,
                               openai=True, headers={PRECISION_HEADER: precision})
        done = await self.text.complete(request.receive, account_id, spec, prompt, params, busy)
        head["system_fingerprint"] = fingerprint(done.weight_precision)
        return JSONResponse(_completion(head, done.choices),
                            headers={PRECISION_HEADER: done.weight_precision})

    async def embeddings(self, request: Request) -> Response:
        body = _EMBEDDINGS.check(await read_json(request, self.node.settings.max_request_bytes))
        name = body["model"]
        spec = find_model(self.node.catalog, name, (TEXT_EMBEDDINGS,))
        texts = as_texts(body["input"])
        encoding = given(body, "encoding_format", "float")
        embeddings = await self.embedder.embed(spec, texts)
        data = [{"object": "embedding", "index": i, "embedding": _vector(row, encoding)}
                for i, row in enumerate(embeddings.vectors)]
        tokens = embeddings.num_tokens
        return JSONResponse({"object": "list", "data": data, "model": name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                            headers={PRECISION_HEADER: embeddings.weight_precision})

    async def models(self, request: Request) -> Response:
        return JSONResponse(openai_model_list(self.node.catalog))


def fingerprint(weight_precision: str) -> str:
    """OpenAI's `system_fingerprint` names the backend configuration a response came from;
    here that is the weights' precision: `edgefire-int4-g32`."""
    return f"edgefire-{weight_precision}"


def _completion(head: dict, done: list[Completion]) -> dict:
    return {**head, "object": "chat.completion",
            "choices": [{"index": i, "finish_reason": c.finish_reason, "logprobs": None,
                         "message": {"role": "assistant", "content": c.text, "refusal": None}}
                        for i, c in enumerate(done)],
            "usage": usage_json([c.usage for c in done])}


async def _chunks(generation: Generation, head: dict,
                  include_usage: bool) -> AsyncIterator[dict]:
    # With include_usage every chunk carries `usage`: null, and one last chunk the totals.
    head = {**head, "object": "chat.completion.chunk"} | ({"usage": None} if include_usage else {})

    def chunk(index: int, delta: dict, finish_reason: str | None = None) -> dict:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                     "finish_reason": finish_reason}]}

    usages = []
    for index in range(generation.num_choices):
        yield chunk(index, {"role": "assistant", "content": ""})
        async for output in generation.outputs(index):
            if output.text:
                yield chunk(index, {"content": output.text})
            if output.finished:
                usages.append(output.usage)
                yield chunk(index, {}, output.finish_reason)
    if include_usage:
        yield {**head, "choices": [], "usage": usage_json(usages)}


def _vector(row: torch.Tensor, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI's clients decode it
        return base64.b64encode(row.numpy().astype("<f4").tobytes()).decode()
    return row.tolist()
