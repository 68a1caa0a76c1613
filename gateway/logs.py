"""Per-gateway request logs (reference §5.7), always read and written within one account."""

from __future__ import annotations

import json
import math
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from edgefire.contract.errors import InvalidInputError, NotFoundError
from edgefire.gateway.db import Database, iso_time

MAX_PER_PAGE = 100
# A log keeps the request and response bodies up to this many bytes each (AI Gateway's log
# detail shows both); a longer body keeps its head and says how much was cut.
BODY_LIMIT = 32 * 1024
# Age pruning runs on a write at most this often, deleting at most a batch at a time, so that
# neither a busy gateway nor a first prune of a large backlog stalls the event loop for long.
AGE_PRUNE_INTERVAL_S = 60.0
AGE_PRUNE_BATCH = 5000
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_id_lock = threading.Lock()
_last_id: tuple[int, int] = (-1, 0)


def new_log_id(created_at: float | None = None) -> str:
    """A ULID: 48-bit millisecond time then 80 random bits, as 26 Crockford base32 characters.

    Ids made in the same millisecond count up from the first one's random part, so ids sort in
    creation order, which is what lets AI Gateway log ids double as a time cursor.
    """
    global _last_id
    ms = int((time.time() if created_at is None else created_at) * 1000)
    with _id_lock:
        last_ms, last_random = _last_id
        if ms == last_ms and last_random + 1 < 1 << _RANDOM_BITS:
            random_part = last_random + 1
        else:
            random_part = secrets.randbits(_RANDOM_BITS)
        _last_id = (ms, random_part)
    value = (ms << _RANDOM_BITS) | random_part
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


@dataclass(slots=True, kw_only=True)
class LogRecord:
    account_id: str
    gateway_id: str
    provider: str
    model: str
    path: str
    status_code: int
    success: bool
    request_type: str | None = None
    cached: bool = False
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    duration_ms: int = 0
    metadata: dict = field(default_factory=dict)
    step: int | None = None
    node: str | None = None  # the edge node that served the request (an emulator extension)
    stand_in: str | None = None  # the model that answered for `model` (edgefire.gateway.stand_in)
    request_body: str | None = None  # as the gateway received it, up to BODY_LIMIT
    response_body: str | None = None  # as the client received it (a stream's events), ditto
    created_at: float = field(default_factory=time.time)
    id: str = ""  # assigned from created_at when left empty

    def __post_init__(self) -> None:
        if not self.id:
            self.id = new_log_id(self.created_at)

    def to_json(self) -> dict:
        """The REST log object, where `metadata` is a JSON string and times are ISO 8601."""
        return {
            "id": self.id,
            "provider": self.provider,
            "model": self.model,
            "path": self.path,
            "request_type": self.request_type,
            "status_code": self.status_code,
            "success": self.success,
            "cached": self.cached,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost": self.cost,
            "duration": self.duration_ms,
            "metadata": json.dumps(self.metadata) if self.metadata else None,
            "step": self.step,
            "node": self.node,
            "stand_in": self.stand_in,
            "created_at": iso_time(self.created_at),
        }


def scalar_object(raw: str, field: str) -> dict:
    """raw as a JSON object of scalar values (a log's metadata), or 5006 naming field."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not all(
            isinstance(v, str | int | float | bool) or v is None for v in data.values()):
        raise InvalidInputError(f"{field} must be a JSON object of scalar values", field=field)
    return data


def captured_body(body: bytes, size: int | None = None) -> str:
    """body (the head of `size` bytes, if given) as text for a log: at most BODY_LIMIT bytes,
    then a marker saying how many were cut."""
    size = len(body) if size is None else size
    text = body[:BODY_LIMIT].decode("utf-8", "replace")
    if size > BODY_LIMIT:
        text += f"\n[truncated: {size - BODY_LIMIT} more bytes]"
    return text


class BodyCapture:
    """The head of a streamed body, as much as a log keeps of it, and the whole body's size."""

    __slots__ = ("_head", "_size")

    def __init__(self) -> None:
        self._head = bytearray()
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if len(self._head) < BODY_LIMIT:
            self._head += chunk[:BODY_LIMIT - len(self._head)]

    def text(self) -> str:
        return captured_body(bytes(self._head), self._size)


def _record(row: sqlite3.Row) -> LogRecord:
    values = dict(row)
    values["success"] = bool(values["success"])
    values["cached"] = bool(values["cached"])
    values["metadata"] = json.loads(values["metadata"])
    return LogRecord(**values)


def _where(account_id: str, gateway_id: str, success: bool | None, cached: bool | None,
           provider: str | None, model: str | None,
           metadata: dict | None = None) -> tuple[str, list[object]]:
    """SQL for the filters; `metadata` matches logs whose metadata has every given entry."""
    clauses = ["account_id = ?", "gateway_id = ?"]
    params: list[object] = [account_id, gateway_id]
    for column, value in (("success", success), ("cached", cached), ("provider", provider),
                          ("model", model)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    for key, value in (metadata or {}).items():
        if '"' in key or "\\" in key:
            raise InvalidInputError("metadata keys may not contain quotes or backslashes",
                                    field="metadata")
        clauses.append("json_extract(metadata, ?) IS ?")
        params += [f'$."{key}"', value]
    return " AND ".join(clauses), params


@dataclass(frozen=True, slots=True)
class LogRetention:
    """How many logs a gateway keeps (the oldest go first) and, if set, how old they may get.

    As AI Gateway's DELETE_OLDEST log management does, a gateway over its limit is pruned in
    chunks: every `max_per_gateway // 1000` writes (0.1%), so it overshoots by at most that.
    """

    max_per_gateway: int = 100_000
    max_age_s: float | None = None

    @property
    def prune_every(self) -> int:
        return max(1, self.max_per_gateway // 1000)


class LogStore:
    def __init__(self, db: Database, retention: LogRetention = LogRetention(),
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.retention = retention
        self._clock = clock
        self._writes: dict[tuple[str, str], int] = {}  # per gateway, since its last prune
        self._next_age_prune = -math.inf

    def add(self, record: LogRecord) -> None:
        """Store a log; NotFoundError if its gateway no longer exists (deleted mid-request)."""
        row = asdict(record)
        row["metadata"] = json.dumps(record.metadata)
        columns = ", ".join(row)
        try:
            self.db.execute(f"INSERT INTO logs ({columns}) VALUES ({', '.join('?' * len(row))})",
                            tuple(row.values()))
        except sqlite3.IntegrityError as exc:
            if "FOREIGN KEY" not in str(exc):
                raise
            raise NotFoundError(f"no gateway {record.gateway_id!r}", field="gateway_id") from None
        self._prune_after_write(record.account_id, record.gateway_id)

    def _prune_after_write(self, account_id: str, gateway_id: str) -> None:
        gateway = (account_id, gateway_id)
        self._writes[gateway] = self._writes.get(gateway, 0) + 1
        if self._writes[gateway] >= self.retention.prune_every:
            self._writes[gateway] = 0
            self.prune_gateway(account_id, gateway_id)
        if self.retention.max_age_s is not None and self._clock() >= self._next_age_prune:
            full_batch = self.prune_old() == AGE_PRUNE_BATCH
            # A full batch means more are due: the next write prunes again.
            self._next_age_prune = self._clock() + (0 if full_batch else AGE_PRUNE_INTERVAL_S)

    def prune_gateway(self, account_id: str, gateway_id: str) -> int:
        """Delete the gateway's logs beyond its newest `max_per_gateway`; how many went."""
        newest_dropped = self.db.query(
            "SELECT created_at, id FROM logs WHERE account_id = ? AND gateway_id = ?"
            " ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET ?",
            (account_id, gateway_id, self.retention.max_per_gateway))
        if not newest_dropped:
            return 0
        created_at, log_id = newest_dropped[0]
        return self.db.execute(
            "DELETE FROM logs WHERE account_id = ? AND gateway_id = ?"
            " AND (created_at < ? OR (created_at = ? AND id <= ?))",
            (account_id, gateway_id, created_at, created_at, log_id))

    def prune_old(self) -> int:
        """Delete up to AGE_PRUNE_BATCH logs older than `max_age_s`, of any gateway."""
        assert self.retention.max_age_s is not None, "age pruning needs a maximum age"
        cutoff = self._clock() - self.retention.max_age_s
        return self.db.execute(
            "DELETE FROM logs WHERE id IN"
            " (SELECT id FROM logs WHERE created_at < ? ORDER BY created_at LIMIT ?)",
            (cutoff, AGE_PRUNE_BATCH))

    def get(self, account_id: str, gateway_id: str, log_id: str) -> LogRecord | None:
        rows = self.db.query(
            "SELECT * FROM logs WHERE account_id = ? AND gateway_id = ? AND id = ?",
            (account_id, gateway_id, log_id))
        return _record(rows[0]) if rows else None

    def list(self, account_id: str, gateway_id: str, *, page: int = 1, per_page: int = 20,
             success: bool | None = None, cached: bool | None = None,
             provider: str | None = None, model: str | None = None,
             metadata: dict | None = None,
             order_desc: bool = True) -> tuple[list[LogRecord], int]:
        """One page of the gateway's logs, oldest or newest first, and the total that match."""
        if type(page) is not int or page < 1:
            raise InvalidInputError("page must be a positive integer", field="page")
        if type(per_page) is not int or not 1 <= per_page <= MAX_PER_PAGE:
            raise InvalidInputError(f"per_page must be 1..{MAX_PER_PAGE}", field="per_page")
        where, params = _where(account_id, gateway_id, success, cached, provider, model,
                               metadata)
        total = self.db.query(f"SELECT COUNT(*) FROM logs WHERE {where}", params)[0][0]
        direction = "DESC" if order_desc else "ASC"
        rows = self.db.query(
            f"SELECT * FROM logs WHERE {where} ORDER BY created_at {direction}, id {direction}"
            " LIMIT ? OFFSET ?", (*params, per_page, (page - 1) * per_page))
        return [_record(row) for row in rows], total

    def delete(self, account_id: str, gateway_id: str, *, success: bool | None = None,
               cached: bool | None = None, provider: str | None = None,
               model: str | None = None, metadata: dict | None = None) -> int:
        """Delete the gateway's logs that match every given filter; how many went."""
        where, params = _where(account_id, gateway_id, success, cached, provider, model,
                               metadata)
        return self.db.execute(f"DELETE FROM logs WHERE {where}", params)
