"""Workers AI's run route: `POST …/ai/run/{model}` with the model's own inputs and outputs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from edgefire.contract import embeddings, text_generation
from edgefire.contract.bodies import read_json
from edgefire.contract.catalog import ModelSpec
from edgefire.contract.envelope import success
from edgefire.contract.errors import InvalidInputError
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

_Handler = Callable[[Request, ModelSpec, dict[str, Any]], Awaitable[Response]]


class WorkersAIRoutes:
    def __init__(self, node: EdgeNode, text: TextGenerator, embedder: Embedder) -> None:
        self.node = node
        self.text = text
        self.embedder = embedder
        self._by_task: dict[str, _Handler] = {TEXT_GENERATION: self._generate,
                                              TEXT_EMBEDDINGS: self._embed}

    async def run(self, request: Request) -> Response:
        name = request.path_params["model"]
        spec = self.node.catalog.find(name, self._by_task)
        body = await read_json(request, self.node.settings.max_request_bytes)
        return await self._by_task[spec.task](request, spec, body)

    async def _generate(self, request: Request, spec: ModelSpec, body: dict[str, Any]) -> Response:
        account_id = request.path_params["account_id"]
        inputs = text_generation.parse_run(body)
        if inputs.stream:
            generation = await self.text.start(account_id, spec, inputs,
                                               request.headers.get(PREFILL_NODE))
            events = _tool_events(generation) if inputs.calls_tools else _events(generation)
            return EventStream(events, generation.close, openai=False,
                               headers=generation.stream_headers)
        completed = await self.text.complete(request.receive, account_id, spec, inputs,
                                             request.headers.get(PREFILL_NODE))
        [done] = completed.choices
        if inputs.calls_tools:
            result = _tool_result(done)
        else:
            result = {"response": _parsed(done) if inputs.json_mode else done.text,
                      "finish_reason": done.finish_reason}
        return success({**result, "usage": usage_json([done.usage])},
                       headers=completed.headers)

    async def _embed(self, request: Request, spec: ModelSpec, body: dict[str, Any]) -> Response:
        inputs = embeddings.parse_run(body, spec)
        result = await self.embedder.embed(spec, inputs.texts)
        vectors = result.vectors
        return success({"shape": list(vectors.shape), "data": vectors.tolist(),
                        "pooling": inputs.pooling},
                       headers=answer_headers(spec, result.weight_precision))


async def _events(generation: Generation) -> AsyncIterator[dict]:
    async for output in generation.outputs(0):
        if output.text:
            yield {"response": output.text}
        if output.finished:
            yield {"response": "", "finish_reason": output.finish_reason,
                   "usage": usage_json([output.usage])}


def _tool_result(done: Completion) -> dict[str, Any]:
    """Workers AI's native form of a tools answer: calls with their arguments as objects."""
    answer = tool_calls.read_answer(done.text)
    return {"response": answer.text, "tool_calls": answer.calls,
            "finish_reason": "tool_calls" if answer.calls else done.finish_reason}


async def _tool_events(generation: Generation) -> AsyncIterator[dict]:
    # A call is usable only whole: the answer is read to its end, then sent as events.
    done = await generation.collect(0)
    result = _tool_result(done)
    if result["response"]:
        yield {"response": result["response"]}
    if result["tool_calls"]:
        yield {"response": "", "tool_calls": result["tool_calls"]}
    yield {"response": "", "finish_reason": result["finish_reason"],
           "usage": usage_json([done.usage])}


def _parsed(done: Completion) -> Any:
    """JSON mode's answer as Workers AI gives it: the parsed value. Decoding was held to the
    schema, so only an answer cut short (max_tokens, a stop string) is not whole."""
    try:
        return json.loads(done.text)
    except ValueError:
        raise InvalidInputError(
            f"JSON Mode couldn't be met: the answer ended ({done.finish_reason}) before its "
            "JSON value was complete; raise max_tokens", field="max_tokens") from None
