"""OpenAI-compatible routes under `…/ai/v1/`: bare OpenAI bodies, no Cloudflare envelope."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgefire.contract import embeddings, text_generation
from edgefire.contract.bodies import read_json
from edgefire.contract.catalog_api import openai_model_list
from edgefire.contract.headers import PREFILL_NODE
from edgefire.contract.schemas import TEXT_EMBEDDINGS, TEXT_GENERATION
from edgefire.contract.sse import EventStream
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.server import tool_calls
from edgefire.runtime.server.embedding import Embedder
from edgefire.runtime.server.generation import (
    Completion,
    Generation,
    TextGenerator,
    answer_headers,
    usage_json,
)


class OpenAIRoutes:
    def __init__(self, node: EdgeNode, text: TextGenerator, embedder: Embedder) -> None:
        self.node = node
        self.text = text
        self.embedder = embedder

    async def chat_completions(self, request: Request) -> Response:
        body = await read_json(request, self.node.settings.max_request_bytes)
        inputs = text_generation.parse_chat(body)
        name = body["model"]
        spec = self.node.catalog.find(name, (TEXT_GENERATION,))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
        account_id = request.path_params["account_id"]
        if inputs.stream:
            generation = await self.text.start(account_id, spec, inputs,
                                               request.headers.get(PREFILL_NODE))
            precision = generation.weight_precision
            head["system_fingerprint"] = fingerprint(precision)
            return EventStream(_chunks(generation, head, inputs.include_usage,
                                       inputs.calls_tools),
                               generation.close, openai=True, headers=generation.stream_headers)
        done = await self.text.complete(request.receive, account_id, spec, inputs,
                                        request.headers.get(PREFILL_NODE))
        head["system_fingerprint"] = fingerprint(done.weight_precision)
        return JSONResponse(_completion(head, done.choices, inputs.calls_tools),
                            headers=done.headers)

    async def embeddings(self, request: Request) -> Response:
        body = await read_json(request, self.node.settings.max_request_bytes)
        inputs = embeddings.parse_openai(body)
        name = body["model"]
        spec = self.node.catalog.find(name, (TEXT_EMBEDDINGS,))
        result = await self.embedder.embed(spec, inputs.texts)
        data = [{"object": "embedding", "index": i,
                 "embedding": _vector(row, inputs.encoding_format)}
                for i, row in enumerate(result.vectors)]
        tokens = result.num_tokens
        return JSONResponse({"object": "list", "data": data, "model": name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                            headers=answer_headers(spec, result.weight_precision))

    async def models(self, request: Request) -> Response:
        return JSONResponse(openai_model_list(self.node.catalog))


def fingerprint(weight_precision: str) -> str:
    """OpenAI's `system_fingerprint` names the backend configuration a response came from;
    here that is the weights' precision: `edgefire-int4-g32`."""
    return f"edgefire-{weight_precision}"


def _message(done: Completion, tools: bool) -> tuple[dict, str]:
    """A choice's assistant message and finish_reason; with tools, its calls as OpenAI's
    (ids, arguments as JSON text) and finish_reason "tool_calls" when it made any."""
    if not tools:
        return {"role": "assistant", "content": done.text, "refusal": None}, done.finish_reason
    answer = tool_calls.read_answer(done.text)
    message = {"role": "assistant", "content": answer.text or None, "refusal": None}
    if not answer.calls:
        return message, done.finish_reason
    message["tool_calls"] = [
        {"id": tool_calls.call_id(), "type": "function",
         "function": {"name": call["name"],
                      "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
        for call in answer.calls]
    return message, "tool_calls"


def _completion(head: dict, done: list[Completion], tools: bool) -> dict:
    choices = []
    for i, c in enumerate(done):
        message, finish_reason = _message(c, tools)
        choices.append({"index": i, "finish_reason": finish_reason, "logprobs": None,
                        "message": message})
    return {**head, "object": "chat.completion", "choices": choices,
            "usage": usage_json([c.usage for c in done])}


async def _chunks(generation: Generation, head: dict, include_usage: bool,
                  tools: bool) -> AsyncIterator[dict]:
    # With include_usage every chunk carries `usage`: null, and one last chunk the totals.
    head = {**head, "object": "chat.completion.chunk"} | ({"usage": None} if include_usage else {})

    def chunk(index: int, delta: dict, finish_reason: str | None = None) -> dict:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                     "finish_reason": finish_reason}]}

    usages = []
    for index in range(generation.num_choices):
        yield chunk(index, {"role": "assistant", "content": ""})
        if tools:  # a call is usable only whole: read the answer to its end first
            done = await generation.collect(index)
            usages.append(done.usage)
            message, finish_reason = _message(done, tools)
            if message["content"]:
                yield chunk(index, {"content": message["content"]})
            calls = [{"index": k, **call} for k, call in enumerate(message.get("tool_calls", []))]
            if calls:
                yield chunk(index, {"tool_calls": calls})
            yield chunk(index, {}, finish_reason)
            continue
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
