"""Record/replay: EDGEFIRE_RECORD_DIR records what the inference routes answer, byte for byte;
EDGEFIRE_REPLAY_DIR answers those routes from the recordings only, so a test suite runs with no
node and no model (file format and request key: edgefire.gateway.recordings).

It is ASGI middleware, outside the routes and InternalErrorMiddleware, because that is where
the answer is exactly the bytes the client receives: headers the pipeline adds (cf-aig-*),
stream chunks as they were sent, error envelopes from any layer. It covers every POST on the
inference URL forms (Workers AI REST run, its OpenAI routes, the AI Gateway provider, compat
and universal URLs) and a Worker's env.AI run() in either form (direct or Miniflare-wrapped,
keyed unwrapped, so one form replays the other); catalog reads, the binding's models search and
getLog, and administration are answered live either way.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgefire.contract.errors import ConfigError, EdgefireError
from edgefire.contract.headers import REQUEST_ID
from edgefire.contract.http_errors import error_body, is_openai_path
from edgefire.gateway.auth import Authenticator
from edgefire.gateway.binding_call import BindingCall, binding_account, binding_inference
from edgefire.gateway.recordings import Exchange, Player, Recorder, RequestKey
from edgefire.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

# The inference URL forms, each with the account it is made for.
_INFERENCE = (
    re.compile(r"/client/v4/accounts/(?P<account>[^/]+)/ai/(?:run/.+|v1/(?:chat/completions"
               r"|embeddings))"),
    re.compile(r"/v1/(?P<account>[^/]+)/[^/]+(?:/.+)?"),
)


def recording_middleware(settings: GatewaySettings, auth: Authenticator) -> list[Middleware]:
    """The middleware the settings ask for (none, recording or replaying)."""
    if settings.record_dir and settings.replay_dir:
        raise ConfigError("EDGEFIRE_RECORD_DIR and EDGEFIRE_REPLAY_DIR are exclusive: set one")
    if settings.replay_dir:
        player = Player(settings.replay_dir, settings.replay_exhausted)
        return [Middleware(ReplayMiddleware, player=player, auth=auth, settings=settings)]
    if settings.record_dir:
        return [Middleware(RecordMiddleware, recorder=Recorder(settings.record_dir),
                           max_bytes=settings.max_batch_bytes)]
    return []


@dataclass(frozen=True, slots=True)
class _Inference:
    """An inference request as its key sees it: a binding call unwrapped, with no account."""

    path: str
    query: str
    headers: list[tuple[str, str]]
    account: str | None  # the one in the path; None for a Worker's env.AI call
    binding: BindingCall | None

    @classmethod
    def of(cls, scope: Scope) -> _Inference | None:
        """None for any request that is not inference (answered live)."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        for pattern in _INFERENCE:
            match = pattern.fullmatch(scope["path"])
            if match:
                headers = [(k.decode("latin-1"), v.decode("latin-1"))
                           for k, v in scope["headers"]]
                return cls(scope["path"], scope["query_string"].decode("latin-1"), headers,
                           match["account"], None)
        call = binding_inference(scope)
        if call is None:
            return None
        return cls(call.path, str(call.query), list(call.headers.items()), None, call)

    def key(self, body: bytes) -> RequestKey:
        return RequestKey.of("POST", self.path, self.query, self.headers, body)


async def _read(receive: Receive, max_bytes: int) -> tuple[bytes, bool]:
    """The body, or as much as max_bytes allows (False): the route then answers 3006 itself."""
    chunks, size, more = [], 0, True
    while more and size <= max_bytes:
        message = await receive()
        if message["type"] != "http.request":  # the client left: the route sees it too
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
    return b"".join(chunks), not more


def _replaying(body: bytes, complete: bool, receive: Receive) -> Receive:
    """receive for the app: the body read already, then the client's own messages (a
    disconnect, which routes watch for)."""
    pending = [{"type": "http.request", "body": body, "more_body": not complete}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


class RecordMiddleware:
    def __init__(self, app: ASGIApp, recorder: Recorder, max_bytes: int) -> None:
        self.app, self.recorder, self.max_bytes = app, recorder, max_bytes
        self._writing: set[asyncio.Future] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _Inference.of(scope)
        if request is None:
            await self.app(scope, receive, send)
            return
        body, complete = await _read(receive, self.max_bytes)
        if not complete:  # too large to be answered, so nothing to record
            await self.app(scope, _replaying(body, complete, receive), send)
            return
        key = request.key(body)
        index = self.recorder.reserve(key)
        began = time.monotonic()
        answer = Exchange(0, [], 0.0, [])
        stored = False

        async def recorded(message: Message) -> None:
            nonlocal stored
            now = time.monotonic() - began
            if message["type"] == "http.response.start":
                answer.status, answer.started_at = message["status"], now
                answer.headers = [(k.decode("latin-1"), v.decode("latin-1"))
                                  for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    answer.chunks.append((now, bytes(message["body"])))
                if not message.get("more_body", False):  # stored before the client has it
                    stored = True
                    await self._store(key, index, answer)
            await send(message)

        await self.app(scope, _replaying(body, complete, receive), recorded)
        if not stored and answer.status:
            # The client hung up mid-stream (the binding does once it has read `[DONE]`), so
            # the end never went out: what was sent until then is what it received.
            await self._store(key, index, answer)

    async def _store(self, key: RequestKey, index: int, answer: Exchange) -> None:
        """Writes in a worker thread, shielded: a client that hangs up cancels this task, and
        a cancelled to_thread whose thread had not started yet would never write the file."""
        writing = asyncio.ensure_future(asyncio.to_thread(self._write, key, index, answer))
        self._writing.add(writing)  # the loop keeps only weak references to tasks
        writing.add_done_callback(self._writing.discard)
        await asyncio.shield(writing)

    def _write(self, key: RequestKey, index: int, answer: Exchange) -> None:
        try:
            self.recorder.store(key, index, answer)
        except OSError:  # a full disk costs the recording, not the answer
            log.exception("could not record the answer to %s %s", key.method, key.path)


class ReplayMiddleware:
    def __init__(self, app: ASGIApp, player: Player, auth: Authenticator,
                 settings: GatewaySettings) -> None:
        self.app, self.player, self.auth, self.settings = app, player, auth, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _Inference.of(scope)
        if request is None:
            await self.app(scope, receive, send)
            return
        body, complete = await _read(receive, self.settings.max_batch_bytes)
        if not complete:  # the route refuses it (3006) before it would reach a node
            await self.app(scope, _replaying(body, complete, receive), send)
            return
        began = time.monotonic()
        try:
            self._authenticate(scope, request)
            answer = self.player.answer(request.key(body))
        except EdgefireError as exc:
            await self._refuse(scope, receive, send, request, exc)
            return
        await self._wait(began, answer.started_at)
        await send({"type": "http.response.start", "status": answer.status,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                for k, v in answer.headers]})
        for at, data in answer.chunks:
            await self._wait(began, at)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _authenticate(self, scope: Scope, request: _Inference) -> None:
        """The credentials are not part of the key, but the live route's rule still holds."""
        if request.binding is not None:  # a token of any account, or dev from this machine
            binding_account(scope, request.binding, self.auth.accounts,
                            self.settings.binding_account)
        elif request.account is not None:
            self.auth.check(Headers(scope=scope), request.account)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, request: _Inference,
                      exc: EdgefireError) -> None:
        """In the route's own error shape; a binding call's, as routes_binding renders it
        (run() throws it as InferenceUpstreamError "<code>: <message>"), with a request id."""
        if request.binding is not None:
            response = JSONResponse(error_body(exc, openai=False), exc.status,
                                    {REQUEST_ID: str(uuid.uuid4())})
        else:
            response = JSONResponse(error_body(exc, is_openai_path(scope["path"])), exc.status)
        await response(scope, receive, send)

    async def _wait(self, began: float, at: float) -> None:
        """Until the recorded offset (scaled by the speed) from the request's arrival."""
        speed = self.settings.replay_speed
        if speed > 0:
            delay = began + at / speed - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
