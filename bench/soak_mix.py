"""The soak's request mix: what a simulated client sends, and what counts as a right answer.

Every request is bounded in time (the client's timeout) and goes to the fleet's gateway. An
outcome is a status (an HTTP code, or what happened instead: `disconnected` on purpose,
`timeout`, `dropped` connection, `broken_stream`) and whether it was expected. A 5xx, a
dropped connection and a stream that fails or ends without `[DONE]` are server failures.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from bench._common import SENTENCES

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"
PENALTIES = ({"repetition_penalty": 1.1}, {"frequency_penalty": 0.3},
             {"presence_penalty": 0.3})  # documented Workers AI inputs, in range
CACHED_PROMPTS = tuple(f"In one word, the colour of {t}?" for t in ("grass", "sky", "snow"))


@dataclass(slots=True)
class Outcome:
    kind: str
    status: str  # "200", "400", … or disconnected | timeout | dropped | broken_stream
    latency_s: float | None  # to the end of the answer; None if the client left or gave up
    expected: bool
    server_failure: bool
    case: str | None = None  # the bad input sent, for bad_input
    detail: str | None = None  # for an unexpected outcome or an error outside the envelope
    cache: str | None = None  # cf-aig-cache-status
    envelope_ok: bool | None = None  # for an error answer: in the envelope its route speaks


@dataclass(slots=True)
class Client:
    http: httpx.AsyncClient  # base_url: the gateway; carries the account's token
    account: str
    rng: random.Random
    timeout_s: float

    def run_path(self, model: str) -> str:
        return f"/client/v4/accounts/{self.account}/ai/run/{model}"

    def openai_path(self, what: str) -> str:
        return f"/client/v4/accounts/{self.account}/ai/v1/{what}"

    def text(self, low: int = 1, high: int = 3) -> str:
        return " ".join(self.rng.sample(SENTENCES, self.rng.randint(low, high)))

    def sampling(self) -> dict:
        body = {"max_tokens": self.rng.randint(4, 24),
                "temperature": round(self.rng.uniform(0, 1), 2)}
        if self.rng.random() < 0.3:
            body["seed"] = self.rng.randint(1, 10**6)
        return body

    def messages(self) -> list[dict]:
        return [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": self.text()}]


async def post(c: Client, kind: str, path: str, *, body: object = None, raw: bytes | None = None,
               headers: dict | None = None, expect: frozenset = frozenset({"200"}),
               openai: bool = False, stream: bool = False, leave_after: int | None = None,
               case: str | None = None) -> Outcome:
    """One request and its verdict; leave_after=k closes a stream after k events."""
    content = raw if raw is not None else json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    started = time.perf_counter()
    try:
        async with asyncio.timeout(c.timeout_s), \
                c.http.stream("POST", path, content=content, headers=hdrs) as response:
            status = str(response.status_code)
            if status == "200" and stream:
                broken = await _read_events(response, leave_after)
                if broken == "left":
                    return Outcome(kind, "disconnected", None, True, False, case)
                if broken:
                    return Outcome(kind, "broken_stream", None, False, True, case, broken)
                payload = b""
            else:
                payload = await response.aread()
            cache = response.headers.get("cf-aig-cache-status")
    except TimeoutError:
        return Outcome(kind, "timeout", None, False, False, case, "no answer")
    except httpx.TransportError as exc:
        return Outcome(kind, "dropped", None, False, True, case, exc.__class__.__name__)
    latency = time.perf_counter() - started
    expected = status in expect
    envelope = None if status == "200" else _is_envelope(payload, openai)
    detail = None if expected and envelope is not False else \
        payload[:200].decode(errors="replace")
    return Outcome(kind, status, latency, expected, status.startswith("5"), case, detail, cache,
                   envelope)


async def _read_events(response: httpx.Response, leave_after: int | None) -> str | None:
    """None for a clean stream ending in [DONE], "left" if we left, else what was wrong."""
    events = 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return None
        try:
            event = json.loads(line[6:])
        except ValueError:
            return f"unparseable event {line[:80]!r}"
        if "error" in event or event.get("success") is False:
            return f"error event {line[:160]}"
        events += 1
        if leave_after is not None and events >= leave_after:
            return "left"
    return "ended without [DONE]"


def _is_envelope(payload: bytes, openai: bool) -> bool:
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    if openai:
        error = body.get("error") if isinstance(body, dict) else None
        return isinstance(error, dict) and isinstance(error.get("message"), str)
    return (isinstance(body, dict) and body.get("success") is False
            and body.get("result") is None and isinstance(body.get("errors"), list)
            and bool(body["errors"]) and all(isinstance(e.get("code"), int)
                                             for e in body["errors"]))


# The kinds of request. Each returns one outcome.

async def chat_messages(c: Client) -> Outcome:
    return await post(c, "chat_messages", c.run_path(SMOL),
                      body={"messages": c.messages(), **c.sampling()})


async def chat_prompt(c: Client) -> Outcome:
    return await post(c, "chat_prompt", c.run_path(SMOL),
                      body={"prompt": c.text(), **c.sampling()})


async def chat_penalties(c: Client) -> Outcome:
    """Chat with one of the sampling penalties, streamed or not."""
    stream = c.rng.random() < 0.5
    body = {"messages": c.messages(), **c.sampling(), **c.rng.choice(PENALTIES),
            "stream": stream}
    return await post(c, "chat_penalties", c.run_path(SMOL), body=body, stream=stream)


async def chat_stream(c: Client) -> Outcome:
    inputs = {"messages": c.messages()} if c.rng.random() < 0.5 else {"prompt": c.text()}
    return await post(c, "chat_stream", c.run_path(SMOL), stream=True,
                      body={**inputs, **c.sampling(), "stream": True})


async def openai_chat(c: Client) -> Outcome:
    stream = c.rng.random() < 0.4
    s = c.sampling()
    body = {"model": SMOL, "messages": c.messages(), "max_tokens": s["max_tokens"],
            "temperature": s["temperature"], "stream": stream}
    return await post(c, "openai_chat", c.openai_path("chat/completions"), body=body,
                      openai=True, stream=stream)


async def embeddings(c: Client) -> Outcome:
    texts = [c.text(1, 2) for _ in range(c.rng.randint(1, 4))]
    if c.rng.random() < 0.5:
        return await post(c, "embeddings", c.run_path(MINILM), body={"text": texts})
    return await post(c, "embeddings", c.openai_path("embeddings"), openai=True,
                      body={"model": MINILM, "input": texts})


async def gateway_cache(c: Client) -> Outcome:
    """A few fixed prompts through the default gateway with a cache TTL: mostly hits."""
    body = {"prompt": c.rng.choice(CACHED_PROMPTS), "max_tokens": 8, "temperature": 0}
    return await post(c, "gateway_cache", f"/v1/{c.account}/default/workers-ai/{SMOL}",
                      body=body, headers={"cf-aig-cache-ttl": "3600"})


async def disconnect_stream(c: Client) -> Outcome:
    body = {"prompt": c.text(2, 4), "max_tokens": 96, "stream": True}
    return await post(c, "disconnect_stream", c.run_path(SMOL), body=body, stream=True,
                      leave_after=c.rng.randint(1, 3))


async def disconnect_request(c: Client) -> Outcome:
    """A non-streamed request the client gives up on after a random short wait."""
    wait = c.rng.uniform(0.05, 1.5)
    body = {"messages": c.messages(), "max_tokens": 96}
    try:
        return await asyncio.wait_for(post(c, "disconnect_request", c.run_path(SMOL),
                                           body=body), wait)
    except TimeoutError:
        return Outcome("disconnect_request", "disconnected", None, True, False)


@dataclass(slots=True, frozen=True)
class BadCase:
    name: str
    route: str  # run | openai_chat | openai_embeddings | gateway
    body: object = None
    raw: bytes | None = None
    model: str = SMOL
    expect: frozenset = frozenset({"400"})


def _bad_cases() -> tuple[BadCase, ...]:
    msgs = [{"role": "user", "content": "hi"}]
    big = "word " * 180_000  # ~0.9 MB: under the body limit, far past the context window
    return (
        BadCase("malformed_json", "run", raw=b'{"prompt": "hi"'),
        BadCase("body_not_object", "run", raw=b"[1, 2, 3]"),
        BadCase("prompt_not_string", "run", {"prompt": 123}),
        BadCase("messages_not_array", "run", {"messages": "hello"}),
        BadCase("message_without_content", "run", {"messages": [{"role": "user"}]}),
        BadCase("prompt_and_messages", "run", {"prompt": "a", "messages": msgs}),
        BadCase("max_tokens_string", "run", {"prompt": "hi", "max_tokens": "ten"}),
        BadCase("max_tokens_negative", "run", {"prompt": "hi", "max_tokens": -5}),
        BadCase("temperature_too_high", "run", {"prompt": "hi", "temperature": 9}),
        BadCase("top_k_negative", "run", {"prompt": "hi", "top_k": -1}),
        BadCase("repetition_penalty_too_high", "run", {"prompt": "hi", "repetition_penalty": 7}),
        BadCase("frequency_penalty_string", "run", {"prompt": "hi", "frequency_penalty": "x"}),
        BadCase("presence_penalty_negative", "run", {"prompt": "hi", "presence_penalty": -3}),
        BadCase("seed_string", "run", {"prompt": "hi", "seed": "abc"}),
        BadCase("stop_not_strings", "run", {"prompt": "hi", "stop": [1, 2]}),
        BadCase("too_many_stop_strings", "run",
                {"prompt": "hi", "max_tokens": 4, "stop": ["x" * 100] * 1000}),
        BadCase("unknown_model", "run", {"prompt": "hi"}, model="@cf/acme/no-such-model"),
        # No node can host it: the dev fleet answers through its stand-in model and says so
        # in a header (gateway/stand_in.py); without a stand-in it is a 400 (code 5018).
        BadCase("planning_only_model", "run", {"prompt": "hi", "max_tokens": 4},
                model="@cf/meta/llama-3.1-8b-instruct", expect=frozenset({"200", "400"})),
        BadCase("huge_prompt", "run", {"prompt": big, "max_tokens": 4}),
        BadCase("body_too_large", "run", {"prompt": "x" * (1 << 20)}, expect=frozenset({"413"})),
        BadCase("openai_no_messages", "openai_chat", {"model": SMOL, "messages": []}),
        BadCase("openai_n_zero", "openai_chat", {"model": SMOL, "messages": msgs, "n": 0}),
        BadCase("openai_missing_model", "openai_chat", {"messages": msgs}),
        BadCase("embeddings_empty", "run", {"text": []}, model=MINILM),
        BadCase("embeddings_not_strings", "openai_embeddings", {"model": MINILM, "input": [1]}),
        BadCase("gateway_malformed_json", "gateway", raw=b"{nope"),
    )


BAD_CASES = _bad_cases()


async def bad_input(c: Client) -> Outcome:
    case = c.rng.choice(BAD_CASES)
    path = {"run": c.run_path(case.model),
            "openai_chat": c.openai_path("chat/completions"),
            "openai_embeddings": c.openai_path("embeddings"),
            "gateway": f"/v1/{c.account}/default/workers-ai/{case.model}"}[case.route]
    return await post(c, "bad_input", path, body=case.body, raw=case.raw, expect=case.expect,
                      openai=case.route.startswith("openai"), case=case.name)


Kind = Callable[[Client], Awaitable[Outcome]]
# (kind, weight): mostly real traffic, a steady trickle of the rest.
MIX: tuple[tuple[Kind, int], ...] = (
    (chat_messages, 3), (chat_prompt, 3), (chat_penalties, 1), (chat_stream, 3),
    (openai_chat, 2), (embeddings, 2), (gateway_cache, 2), (disconnect_stream, 1),
    (disconnect_request, 1), (bad_input, 3),
)
