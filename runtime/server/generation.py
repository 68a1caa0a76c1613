"""Text generation for the HTTP routes: hold the model, start engine requests, read or stream.

Both API styles (Workers AI and OpenAI) go through `TextGenerator`; they differ only in how
they shape the outputs.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace

from starlette.types import Receive

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.disconnect import unless_disconnected
from edgefire.contract.errors import CapacityError
from edgefire.contract.headers import MINIATURE, PROMPT_TOKENS, WEIGHT_PRECISION
from edgefire.contract.http_errors import time_limit
from edgefire.contract.text_generation import TextGenerationRequest
from edgefire.runtime.engine.outputs import RequestOutput, Usage
from edgefire.runtime.engine.remote_kv.pages import Page
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.served import ServedLM
from edgefire.runtime.server import tool_calls
from edgefire.runtime.server.metrics import RequestTimer, ServerMetrics
from edgefire.runtime.server.prefill import PrefillHandoff
from edgefire.runtime.server.prompts import encode_prompt


@dataclass(slots=True)
class Completion:
    text: str
    finish_reason: str
    usage: Usage


@dataclass(slots=True)
class Completed:
    """A finished call's choices, the precision of the weights that made them and the headers
    its answer carries (answer_headers)."""

    choices: list[Completion]
    weight_precision: str
    headers: dict[str, str]


def answer_headers(spec: ModelSpec, weight_precision: str) -> dict[str, str]:
    """What every inference answer says of the model that made it: its weights' precision and,
    for a miniature run in a big model's place, what of it is synthetic."""
    headers = {WEIGHT_PRECISION: weight_precision}
    if spec.miniature:
        headers[MINIATURE] = spec.miniature
    return headers


@dataclass(slots=True)
class _Choice:
    request_id: str
    stream: AsyncIterator[RequestOutput]
    timer: RequestTimer


class Generation:
    """The engine requests of one API call (one per choice), holding the model until closed."""

    def __init__(self, served: ServedLM, stack: AsyncExitStack, num_prompt_tokens: int) -> None:
        self._served = served
        self._stack = stack
        self._choices: list[_Choice] = []
        self.num_prompt_tokens = num_prompt_tokens

    @property
    def num_choices(self) -> int:
        return len(self._choices)

    @property
    def weight_precision(self) -> str:
        return self._served.weight_precision

    @property
    def headers(self) -> dict[str, str]:
        return answer_headers(self._served.spec, self.weight_precision)

    @property
    def stream_headers(self) -> dict[str, str]:
        """What a streamed answer says up front: answer_headers, the prompt's size."""
        return {**self.headers, PROMPT_TOKENS: str(self.num_prompt_tokens)}

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
            salt: bytes, timer: RequestTimer, pages: list[Page] | None = None) -> None:
        stream = self._served.engine.add_request(request_id, prompt_ids, params, salt, pages)
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
        self.handoff = PrefillHandoff(node, metrics.prefill_handoffs)
        # Keys the prefix-cache salt when the node has no secret; see prefix_cache_salt.
        self._process_key = secrets.token_bytes(32)

    def prefix_cache_salt(self, account_id: str) -> bytes:
        """The per-account salt of the prefix-cache hash chain: HMAC-SHA256 of the account id.

        A bare account id is a salt anyone can reproduce: with a node that takes any account
        id (no secret), a caller naming another tenant's account would share its cache and
        learn from `cached_tokens` (or timing) what that tenant sent. Keyed with the node
        secret, or failing that a key that never leaves this process, it cannot be forged.
        """
        secret = self.node.settings.node_secret
        key = secret.encode() if secret else self._process_key
        return hmac.new(key, account_id.encode(), hashlib.sha256).digest()

    async def start(self, account_id: str, spec: ModelSpec, request: TextGenerationRequest,
                    prefill_node: str | None = None) -> Generation:
        """Engine requests for each of request's choices, running; the caller must close()
        the result. On a decode node, prefill_node (the gateway's PREFILL_NODE header) is
        where the prompt's prefill is handed off to (runtime/server/prefill.py)."""
        started = time.perf_counter()
        request = tool_calls.prepare(request)
        params = per_choice(SamplingParams(**request.sampling), request.n)
        stack = AsyncExitStack()
        try:
            served = await stack.enter_async_context(self.node.registry.use(spec.id))
            if (request.reject_if_busy
                    and served.num_waiting >= self.node.settings.max_waiting_requests):
                raise CapacityError()
            # Off the event loop (a big prompt takes a while; the tokenizer releases the GIL)
            # and off the compute thread, which runs the engine steps.
            prompt_ids = await asyncio.to_thread(encode_prompt, served.tokenizer, request.prompt,
                                                 served.max_model_len, served.max_token_chars)
            generation = Generation(served, stack, len(prompt_ids))
            salt = self.prefix_cache_salt(account_id)
            pages = None
            if prefill_node and self.handoff.accepts(prefill_node):
                pages = await self.handoff.run(prefill_node, served, prompt_ids, salt)
            for p in params:
                timer = self.metrics.timer(spec.id, started)
                timer.num_prompt_tokens = len(prompt_ids)
                generation.add(uuid.uuid4().hex, prompt_ids, p, salt, timer, pages)
        except BaseException as exc:
            status = "error" if isinstance(exc, Exception) else "aborted"
            self.metrics.timer(spec.id, started).end(status)
            await stack.aclose()
            raise
        return generation

    async def complete(self, receive: Receive, account_id: str, spec: ModelSpec,
                       request: TextGenerationRequest,
                       prefill_node: str | None = None) -> Completed:
        """Run to the end within the node's request timeout (3007 past it, aborting), unless
        the client (`receive` is its request's) goes away first: then abort at once."""
        return await unless_disconnected(
            receive, self._complete(account_id, spec, request, prefill_node))

    async def _complete(self, account_id: str, spec: ModelSpec, request: TextGenerationRequest,
                        prefill_node: str | None) -> Completed:
        async with time_limit(self.node.settings.request_timeout_s):
            generation = await self.start(account_id, spec, request, prefill_node)
            try:
                # One at a time is enough: every choice runs in the engine meanwhile.
                choices = [await generation.collect(i) for i in range(generation.num_choices)]
                return Completed(choices, generation.weight_precision, generation.headers)
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
