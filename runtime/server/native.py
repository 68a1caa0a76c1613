"""Workers AI's run route: `POST …/ai/run/{model}` with the model's own inputs and outputs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from edgefire.runtime.catalog import ModelSpec
from edgefire.runtime.errors import InvalidInputError
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.served import TEXT_EMBEDDINGS, TEXT_GENERATION
from edgefire.runtime.server.embedding import Embedder, as_texts
from edgefire.runtime.server.envelope import success
from edgefire.runtime.server.generation import Generation, TextGenerator, usage_json
from edgefire.runtime.server.inputs import (
    find_model,
    given,
    read_json,
    reject_if_busy,
    sampling_params,
)
from edgefire.runtime.server.prompts import prompt_input
from edgefire.runtime.server.schemas import TASK_SCHEMAS
from edgefire.runtime.server.sse import EventStream
from edgefire.runtime.server.validation import Checker
from edgefire.runtime.weight_precision import PRECISION_HEADER
from starlette.requests import Request
from starlette.responses import Response

_Handler = Callable[[Request, ModelSpec, dict[str, Any]], Awaitable[Response]]
_INPUTS = {task: Checker(schemas[0]) for task, schemas in TASK_SCHEMAS.items()}


class WorkersAIRoutes:
    def __init__(self, node: EdgeNode, text: TextGenerator, embedder: Embedder) -> None:
        self.node = node
        self.text = text
        self.embedder = embedder
        self._by_task: dict[str, _Handler] = {TEXT_GENERATION: self._generate,
                                              TEXT_EMBEDDINGS: self._embed}

    async def run(self, request: Request) -> Response:
        name = request.path_params["model"]
        spec = find_model(self.node.catalog, name, self._by_task)
        body = _INPUTS[spec.task].check(
            await read_json(request, self.node.settings.max_request_bytes))
        return await self._by_task[spec.task](request, spec, body)

    async def _generate(self, request: Request, spec: ModelSpec, body: dict[str, Any]) -> Response:
        account_id = request.path_params["account_id"]
        prompt = prompt_input(body)
        params = [sampling_params(body, ("max_tokens",))]
        busy = reject_if_busy(body)
        if given(body, "stream", False):
            generation = await self.text.start(account_id, spec, prompt, params, busy)
            return EventStream(_events(generation), generation.close, openai=False,
                               headers={PRECISION_HEADER: generation.weight_precision})
        completed = await self.text.complete(request.receive, account_id, spec, prompt, params,
                                             busy)
        [done] = completed.choices
        return success({"response": done.text, "usage": usage_json([done.usage])},
                       headers={PRECISION_HEADER: completed.weight_precision})

    async def _embed(self, request: Request, spec: ModelSpec, body: dict[str, Any]) -> Response:
        texts = as_texts(body["text"])
        pooling = spec.extra.get("pooling", "mean")
        if given(body, "pooling", pooling) != pooling:
            raise InvalidInputError(f"pooling must be {pooling!r} for {spec.id}",
                                    field="pooling")
        embeddings = await self.embedder.embed(spec, texts)
        vectors = embeddings.vectors
        return success({"shape": list(vectors.shape), "data": vectors.tolist(),
                        "pooling": pooling},
                       headers={PRECISION_HEADER: embeddings.weight_precision})


async def _events(generation: Generation) -> AsyncIterator[dict]:
    async for output in generation.outputs(0):
        if output.text:
            yield {"response": output.text}
        if output.finished:
            yield {"response": "", "usage": usage_json([output.usage])}
