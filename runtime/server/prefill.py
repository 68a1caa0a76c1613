"""Prefill/decode disaggregation: a decode node hands a prompt's prefill to a prefill node.

The gateway, which keeps the prefill and decode pools apart in its directory, routes a
request to a decode node and names a prefill node in PREFILL_NODE. The decode node asks it
(POST PREFILL_PATH, under the node secret) to compute the prompt's KV under the account's salt;
the pages come back through the KV store when both nodes have one ("store": the prefill node
answers once they are written, and the decode node's ordinary remote lookup finds them), or
else in the answer's body as page records ("http"). The decode node installs them as cached
blocks and decodes; the prompt's last partial block is the only prefill it does itself. If
the prefill node fails, is slow or answers nonsense, the decode node computes the prefill
itself: a hand-off can only save time, never lose a request.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
from urllib.parse import urlsplit

import httpx
from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgefire.contract.bodies import read_json
from edgefire.contract.errors import InvalidInputError
from edgefire.contract.headers import NODE_SECRET
from edgefire.contract.schemas import TEXT_GENERATION
from edgefire.runtime.engine.async_engine import AsyncEngine
from edgefire.runtime.engine.block_manager import prefix_hashes
from edgefire.runtime.engine.remote_kv.pages import Page
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.served import ServedLM

log = logging.getLogger(__name__)

INTERNAL_PREFIX, PREFILL_ROUTE = "/internal/kv", "/prefill"
PREFILL_PATH = INTERNAL_PREFIX + PREFILL_ROUTE
_COUNT = struct.Struct("<I")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def frame(records: list[bytes]) -> bytes:
    return b"".join([_COUNT.pack(len(records)),
                     *(part for r in records for part in (_COUNT.pack(len(r)), r))])


def unframe(body: bytes) -> list[bytes | None]:
    """The records of a framed body; a body cut short ends in None (the rest is refused)."""
    view = memoryview(body)
    if len(view) < _COUNT.size:
        return []
    (count,), offset, records = _COUNT.unpack_from(view), _COUNT.size, []
    for _ in range(count):
        if offset + _COUNT.size > len(view):
            return [*records, None]
        (length,) = _COUNT.unpack_from(view, offset)
        offset += _COUNT.size
        if offset + length > len(view):
            return [*records, None]
        records.append(bytes(view[offset:offset + length]))
        offset += length
    return records


class PrefillRoutes:
    """The prefill node's side: POST PREFILL_PATH {model, prompt_token_ids, salt, via}."""

    def __init__(self, node: EdgeNode) -> None:
        self.node = node

    async def prefill(self, request: Request) -> Response:
        body = await read_json(request, self.node.settings.max_request_bytes)
        ids, salt, via = body.get("prompt_token_ids"), body.get("salt"), body.get("via")
        if not isinstance(ids, list) or not isinstance(salt, str) or via not in ("store",
                                                                                   "http"):
            raise InvalidInputError("expected {model, prompt_token_ids: [int], salt: hex, "
                                    "via: store|http}", field="body")
        try:
            salt_bytes = bytes.fromhex(salt)
        except ValueError:
            raise InvalidInputError("salt must be hex", field="salt") from None
        spec = self.node.catalog.find(str(body.get("model")), (TEXT_GENERATION,))
        started = time.perf_counter()
        async with self.node.registry.use(spec.id) as served:
            assert isinstance(served, ServedLM)
            engine = served.engine
            # One token: the prompt's K/V is computed and published, the rest is the decode
            # node's. Greedy, so the request is the same whatever its sampling would be.
            stream = engine.add_request(uuid.uuid4().hex, ids,
                                        SamplingParams(max_tokens=1, temperature=0.0), salt_bytes)
            async for _ in stream:
                pass
            hashes = prefix_hashes(ids, salt_bytes, engine.block_size)
            tier = engine.remote_tier
            if via == "store" and tier is not None:
                written = await engine.flush_remote(self.node.settings.prefill_timeout_s)
                return JSONResponse({"via": "store", "num_pages": len(hashes) if written else 0,
                                     "seconds": time.perf_counter() - started})
            records = await engine.export_pages(hashes)
        return Response(frame(records), media_type="application/octet-stream",
                        headers={"x-edgefire-kv-pages": str(len(records))})


class PrefillHandoff:
    """The decode node's side: hand a prompt off, or say why not (None: compute it here)."""

    def __init__(self, node: EdgeNode, handoffs: Counter) -> None:
        self.node = node
        self._handoffs = handoffs  # labels: model_name, outcome (store, http or fallback)
        self._client = httpx.Client(timeout=node.settings.prefill_timeout_s)

    def accepts(self, url: str | None) -> bool:
        """Whether to honour a PREFILL_NODE header: only on a decode node, only an http(s)
        origin, and, on a node that runs without a secret (anyone may call it), only one on
        this machine, so an open node cannot be made to post prompts anywhere."""
        if not url or self.node.role != "decode":
            return False
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False
        return bool(self.node.settings.node_secret) or parts.hostname in _LOOPBACK

    async def run(self, url: str, served: ServedLM, prompt_ids: list[int],
                  salt: bytes) -> list[Page] | None:
        """Pages for the prompt's prefix from the prefill node at url, to install; None to go
        on as without a hand-off: the pages went to the store (the request's lookup finds
        them), the hand-off failed, or it was not worth it (fewer uncached prompt tokens than
        prefill_handoff_min_tokens: a short prefill costs a decode step less than a trip)."""
        engine = served.engine
        hashes = prefix_hashes(prompt_ids, salt, engine.block_size)
        num_uncached = len(prompt_ids) - engine.num_cached_leading(hashes) * engine.block_size
        if num_uncached < self.node.settings.prefill_handoff_min_tokens:
            return None
        via = "store" if engine.remote_tier is not None else "http"
        body = {"model": served.spec.id, "prompt_token_ids": prompt_ids, "salt": salt.hex(),
                "via": via}
        try:
            # On a worker thread, with a blocking client: tens of megabytes of pages to read
            # and check would otherwise hold the event loop that streams the other answers
            # (measured in bench/disagg.py --quick: decode ITL p99 2x higher with an async
            # client on a one-core decode node).
            pages = await asyncio.to_thread(self._fetch, url, body, engine, hashes)
        except (httpx.HTTPError, ValueError) as exc:
            self.count(served, "fallback")
            log.warning("prefill hand-off to %s failed (%s: %s); prefilling here", url,
                        type(exc).__name__, exc)
            return None
        self.count(served, "store" if pages is None else "http")
        return pages

    def _fetch(self, url: str, body: dict, engine: AsyncEngine, hashes: list[bytes]
               ) -> list[Page] | None:
        headers = {NODE_SECRET: self.node.settings.node_secret or ""}
        response = self._client.post(url.rstrip("/") + PREFILL_PATH, json=body, headers=headers)
        response.raise_for_status()
        if response.headers.get("content-type", "").startswith("application/json"):
            if response.json().get("via") != "store":
                raise ValueError("the prefill node answered without pages")
            return None
        return engine.accept_records(hashes, unframe(response.content))

    def count(self, served: ServedLM, outcome: str) -> None:
        self._handoffs.labels(served.spec.id, outcome).inc()

    def close(self) -> None:
        self._client.close()
