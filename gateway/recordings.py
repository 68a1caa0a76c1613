"""Recorded exchanges on disk: what identifies a request, and the files that hold its answers.

One file per distinct request, `<slug>-<digest>.json`, pretty-printed so a user can read,
review and commit it:

    {"version": 1,
     "request": {"method": "POST", "path": "/client/v4/accounts/…/ai/run/@cf/…",
                 "headers": {"cf-aig-cache-ttl": "60"}, "body": {"prompt": "Hi"}},
     "responses": [{"status": 200, "headers": [["content-type", "application/json"], …],
                    "started_at": 0.21, "chunks": [{"at": 0.21, "text": "{\\"result\\": …}"}]},
                   …]}

A Worker's env.AI call (edgefire.gateway.binding_call) is keyed as the binding made it, unwrapped
from Miniflare's form: path `/run?version=3` or `/ai-gateway/run?version=3`, with no account
(the binding sends none), and the model from its `cf-consn-model-id` header.

`responses` holds each occurrence of the request in the order it arrived (a sampled model
answers differently each time). A chunk is what the gateway sent in one piece, with its offset
in seconds from the request; `text` when it is UTF-8, else `base64`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from edgefire.contract.errors import ConfigError, ReplayMissError
from edgefire.contract.headers import BINDING_MODEL, NODE_SECRET

VERSION = 1
# Request headers that change the answer. Credentials are left out (cf-aig-authorization and
# the node secret as well as Authorization), so a recording made with one token replays under
# another and no secret is written to a file.
_KEY_HEADER_PREFIXES = ("cf-aig-", "x-edgefire-")
_KEY_HEADERS = ("x-session-affinity", BINDING_MODEL)
_UNKEYED = ("cf-aig-authorization", NODE_SECRET)
_SLUG = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class RequestKey:
    method: str
    path: str  # with its query, parameters sorted
    headers: tuple[tuple[str, str], ...]  # the keyed ones, sorted
    body: Any  # the parsed JSON, or {"base64": …} for a body that is not JSON

    @classmethod
    def of(cls, method: str, path: str, query: str, headers: list[tuple[str, str]],
           body: bytes) -> RequestKey:
        if query:
            path += "?" + "&".join(f"{k}={v}" for k, v in sorted(parse_qsl(query, True)))
        keyed = sorted((k, v) for k, v in headers if _keyed(k))
        return cls(method, path, tuple(keyed), _canonical_body(body))

    def as_dict(self) -> dict:
        return {"method": self.method, "path": self.path, "headers": dict(self.headers),
                "body": self.body}

    @classmethod
    def from_dict(cls, data: dict) -> RequestKey:
        return cls(data["method"], data["path"], tuple(sorted(data["headers"].items())),
                   data["body"])

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def file_name(self) -> str:
        # What follows the account (and gateway): the model or route, to tell files apart; a
        # binding call's path has neither, so its route and model header.
        path = self.path.split("?")[0]
        model = dict(self.headers).get(BINDING_MODEL)
        if model:
            tail = f"{path}/{model}"
        else:
            tail = path.rsplit("/ai/", 1)[1] if "/ai/" in path else "/".join(path.split("/")[4:])
        return f"{_SLUG.sub('-', tail.lower()).strip('-')[:60]}-{self.digest[:16]}.json"


def _keyed(header: str) -> bool:
    return header not in _UNKEYED and (header in _KEY_HEADERS
                                       or header.startswith(_KEY_HEADER_PREFIXES))


def _canonical_body(body: bytes) -> Any:
    """JSON bodies by value (key order and spacing do not matter), others by their bytes."""
    try:
        return json.loads(body, parse_constant=_not_json) if body else None
    except (ValueError, RecursionError):
        return {"base64": base64.b64encode(body).decode()}


def _not_json(name: str) -> None:
    raise ValueError(name)  # NaN and Infinity: kept as bytes, as the routes refuse them


@dataclass(slots=True)
class Exchange:
    """One recorded answer: status, headers and body chunks with their time offsets."""

    status: int
    headers: list[tuple[str, str]]
    started_at: float
    chunks: list[tuple[float, bytes]]

    def as_dict(self) -> dict:
        return {"status": self.status, "headers": [list(h) for h in self.headers],
                "started_at": round(self.started_at, 4),
                "chunks": [_chunk(at, data) for at, data in self.chunks]}

    @classmethod
    def from_dict(cls, data: dict) -> Exchange:
        chunks = [(c["at"], c["text"].encode() if "text" in c else base64.b64decode(c["base64"]))
                  for c in data["chunks"]]
        return cls(data["status"], [(k, v) for k, v in data["headers"]], data["started_at"],
                   chunks)


def _chunk(at: float, data: bytes) -> dict:
    try:
        return {"at": round(at, 4), "text": data.decode()}
    except UnicodeDecodeError:  # binary, or a chunk that splits a character
        return {"at": round(at, 4), "base64": base64.b64encode(data).decode()}


class Recorder:
    """Writes each request's answers to its file as they complete. A request's file is
    started afresh the first time this process sees it, so recording again replaces what an
    earlier run recorded instead of appending to it; requests not made again keep theirs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._answers: dict[str, tuple[RequestKey, list[Exchange | None]]] = {}
        self._lock = threading.Lock()  # files are written from worker threads

    def reserve(self, key: RequestKey) -> int:
        """The occurrence number of a request, taken when it arrives (the order it is
        replayed in), not when its answer completes."""
        with self._lock:
            _, slots = self._answers.setdefault(key.digest, (key, []))
            slots.append(None)
            return len(slots) - 1

    def store(self, key: RequestKey, index: int, exchange: Exchange) -> None:
        """Runs in a worker thread; a request cut off before its answer ended is never stored,
        and later occurrences keep their order."""
        with self._lock:
            _, slots = self._answers[key.digest]
            slots[index] = exchange
            text = _document([e for e in slots if e is not None], key)
            path = self.directory / key.file_name()
            partial = path.with_suffix(".json.tmp")
            partial.write_text(text)
            partial.replace(path)  # readers (and a crash) see the old file or the new one


def _document(answers: list[Exchange], key: RequestKey) -> str:
    """The file's JSON, laid out for reading and diffs: one line per header list and chunk."""
    responses = []
    for answer in answers:
        data = answer.as_dict()
        chunks = ",\n    ".join(json.dumps(c) for c in data["chunks"])
        responses.append(f'  {{"status": {data["status"]}, "started_at": {data["started_at"]},\n'
                         f'   "headers": {json.dumps(data["headers"])},\n'
                         f'   "chunks": [\n    {chunks}]}}')
    request = json.dumps(key.as_dict(), indent=2).replace("\n", "\n ")
    return (f'{{"version": {VERSION},\n "request": {request},\n "responses": [\n'
            + ",\n".join(responses) + "]}\n")


class Player:
    """Answers from a folder of recordings; each request's occurrences in recorded order."""

    def __init__(self, directory: Path, exhausted: str) -> None:
        self.exhausted = exhausted
        self._recorded: dict[str, tuple[RequestKey, list[Exchange]]] = {}
        self._served: dict[str, int] = {}
        if not directory.is_dir():
            raise ConfigError(f"EDGEFIRE_REPLAY_DIR {directory} is not a folder")
        for path in sorted(directory.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                key = RequestKey.from_dict(data["request"])
                answers = [Exchange.from_dict(r) for r in data["responses"]]
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"recording {path} cannot be read: {exc!r}") from None
            self._recorded[key.digest] = (key, answers)

    def answer(self, key: RequestKey) -> Exchange:
        """The next recorded answer to this request, else ReplayMissError saying why."""
        entry = self._recorded.get(key.digest)
        if entry is None:
            raise ReplayMissError(f"No recording matches this request ({key.method} "
                                  f"{key.path}); {self._nearest(key)}")
        served = self._served.get(key.digest, 0)
        self._served[key.digest] = served + 1
        answers = entry[1]
        if served < len(answers):
            return answers[served]
        if self.exhausted == "cycle" and answers:
            return answers[served % len(answers)]
        raise ReplayMissError(
            f"No recording left for this request ({key.method} {key.path}): it was recorded "
            f"{len(answers)} time(s) and this is call {served + 1} (set "
            "EDGEFIRE_REPLAY_EXHAUSTED=cycle to start again from the first answer)")

    def _nearest(self, key: RequestKey) -> str:
        """The recorded request with the fewest differing fields, and those fields."""
        sent = _flatten(key.as_dict())
        best: list[str] | None = None
        for other, _ in self._recorded.values():
            recorded = _flatten(other.as_dict())
            fields = sorted(f for f in sent.keys() | recorded.keys()
                            if sent.get(f) != recorded.get(f))
            if best is None or len(fields) < len(best):
                best, nearest = fields, recorded
        if best is None:
            return "the recording folder holds no recordings"
        shown = "; ".join(f"{f}: recorded {_short(nearest.get(f))}, sent {_short(sent.get(f))}"
                          for f in best[:3])
        more = f" (and {len(best) - 3} more)" if len(best) > 3 else ""
        return f"the nearest recording differs in {shown}{more}"


def _flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """{"body.messages[0].content": '"Hi"', …}: each leaf as JSON, by its path."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for k, v in value.items():
            out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, v in enumerate(value):
            out |= _flatten(v, f"{prefix}[{i}]")
        return out
    return {prefix: json.dumps(value)}


def _short(value: str | None) -> str:
    if value is None:
        return "nothing"
    return value if len(value) <= 60 else value[:57] + "..."
