"""A fake edge node that answers like a model: native and OpenAI chat bodies, streamed or not,
naming the model it was asked for, with fixed usage. For the gateway's stand-in and
fault-injection tests, which check what reached the node and what the client got."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tests.gateway_fakes import Seen, read_json

WORDS = ["Stand", "-in", " answers", " are", " still", " answers", "."]
USAGE = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}


@dataclass
class ModelUpstream:
    seen: list[Seen] = field(default_factory=list)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_json(receive)
        path = scope["path"]
        self.seen.append(Seen(scope["raw_path"].decode(), scope["query_string"].decode(),
                              {k.decode(): v.decode() for k, v in scope["headers"]}, body))
        openai = path.endswith("/v1/chat/completions")
        model = body.get("model") if openai else path.split("/ai/run/", 1)[1]
        if body.get("stream"):
            events = _openai_events(model) if openai else _native_events()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for event in events:
                await send({"type": "http.response.body", "more_body": True,
                            "body": f"data: {event}\n\n".encode()})
            await send({"type": "http.response.body", "body": b""})
            return
        answer = _openai_answer(model) if openai else {
            "result": {"response": "".join(WORDS), "usage": USAGE}, "success": True,
            "errors": [], "messages": []}
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


def _native_events() -> list[str]:
    return [*(json.dumps({"response": word}) for word in WORDS),
            json.dumps({"response": "", "usage": USAGE}), "[DONE]"]


def _openai_events(model: str) -> list[str]:
    def chunk(delta: dict, finish: str | None = None, **extra: object) -> str:
        return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                           "model": model, "choices": [{"index": 0, "delta": delta,
                                                        "finish_reason": finish}], **extra})

    return [*(chunk({"content": word}) for word in WORDS), chunk({}, "stop", usage=USAGE),
            "[DONE]"]


def _openai_answer(model: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "".join(WORDS)}}],
            "usage": USAGE}
