"""Text generation for the HTTP routes: hold the model, start engine requests, read or stream.

Both API styles (Workers AI and OpenAI) go through `TextGenerator`; they differ only in how
they shape the outputs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace

from runtime.catalog import ModelSpec
from runtime.engine.outputs import RequestOutput, Usage
from runtime.engine.sampling_params import SamplingParams
from runtime.node.model_registry import CapacityError
from runtime.node.node import EdgeNode
from runtime.node.served import TextModel
from runtime.server.errors import BUSY_MESSAGE, time_limit
from runtime.server.metrics import RequestTimer, ServerMetrics
from runtime.server.prompts import PromptInput, encode_prompt


@dataclass(slots=True)
class Completion:
    text: str
    finish_reason: str
    usage: Usage


@dataclass(slots=True)
class Completed:
    """A finished call's choices and the precision of the weights that made them."""

    choices: list[Completion]
    weight_precision: str


@dataclass(slots=True)
class _Choice:
    request_id: str
    stream: AsyncIterator[RequestOutput]
    timer: RequestTimer


class Generation:
    """The engine requests of one API call (one per choice), holding the model until closed."""

    def __init__(self, served: TextModel, stack: AsyncExitStack) -> None:
        self._served = served
        self._stack = stack
        self._choices: list[_Choice] = []

    @property
    def num_choices(self) -> int:
        return len(self._choices)

    @property
    def weight_precision(self) -> str:
        return self._served.weight_precision

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
            salt: bytes, timer: RequestTimer) -> None:
        stream = self._served.engine.add_request(request_id, prompt_ids, params, salt)
        choice = _Choice(request_id, stream, timer)
        self._choices.append(choice)
        self._stack.push_async_callback(self._release, choice)

    async def outputs(self, index: int) -> AsyncIterator[RequestOutput]:
        choice = self._choices[index]
        try:
            async for output in choice.stream:
                choice.timer.observe(output)
                yield output
        except Exception:
            choice.timer.end("error")
            raise

    async def collect(self, index: int) -> Completion:
        parts, last = [], None
        async for last in self.outputs(index):
            parts.append(last.text)
        return Completion("".join(parts), last.finish_reason, last.usage)

    async def close(self) -> None:
        """Abort what is unfinished (freeing its KV now) and release the model."""
        await self._stack.aclose()

    async def _release(self, choice: _Choice) -> None:
        choice.timer.end("aborted")
        await choice.stream.aclose()  # aborts the request, read or not, unless it finished


class TextGenerator:
    def __init__(self, node: EdgeNode, metrics: ServerMetrics) -> None:
        self.node = node
        self.metrics = metrics

    async def start(self, account_id: str, spec: ModelSpec, prompt: PromptInput,
                    params: list[SamplingParams], reject_if_busy: bool) -> Generation:
        """Engine requests for each params, running; the caller must close() the result."""
        started = time.perf_counter()
        stack = AsyncExitStack()
        try:
            served = await stack.enter_async_context(self.node.registry.use(spec.id))
            if reject_if_busy and served.num_waiting >= self.node.settings.max_waiting_requests:
                raise CapacityError(BUSY_MESSAGE)
            prompt_ids = encode_prompt(served.tokenizer, prompt)
            generation = Generation(served, stack)
            # The salt keeps one account's prefix cache out of another's reach.
            salt = account_id.encode()
            for p in params:
                timer = self.metrics.timer(spec.id, started)
                timer.num_prompt_tokens = len(prompt_ids)
                generation.add(uuid.uuid4().hex, prompt_ids, p, salt, timer)
        except BaseException as exc:
            status = "error" if isinstance(exc, Exception) else "aborted"
            self.metrics.timer(spec.id, started).end(status)
            await stack.aclose()
            raise
        return generation

    async def complete(self, account_id: str, spec: ModelSpec, prompt: PromptInput,
                       params: list[SamplingParams], reject_if_busy: bool) -> Completed:
        """Run to the end within the node's request timeout (3007 past it, aborting)."""
        async with time_limit(self.node.settings.request_timeout_s):
            generation = await self.start(account_id, spec, prompt, params, reject_if_busy)
            try:
                # One at a time is enough: every choice runs in the engine meanwhile.
                choices = [await generation.collect(i) for i in range(generation.num_choices)]
                return Completed(choices, generation.weight_precision)
            finally:
                await generation.close()


def per_choice(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n copies of params; seeded ones get seed, seed+1, … so the choices differ."""
    if params.seed is None:
        return [replace(params) for _ in range(n)]
    return [replace(params, seed=params.seed + i) for i in range(n)]


def usage_json(usages: list[Usage]) -> dict:
    """Usage of one call; choices share one prompt, so it counts once."""
    first = usages[0]
    completion = sum(u.completion_tokens for u in usages)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}
