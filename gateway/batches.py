"""Workers AI's async batch: `?queueRequest=true` with `{requests: [...]}` queues the inputs,
`{request_id}` polls them. Queued work lives in the gateway's database, so a restart of the
gateway (or of a node) loses nothing: items left running are queued again on start. A worker
runs one item at a time through the same pipeline as interactive calls, yields while a node
has interactive requests waiting, and keeps every answer for `batch_retention_s`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from edgefire.contract.errors import InvalidInputError, NotFoundError
from edgefire.gateway.db import Database

log = logging.getLogger(__name__)

MAX_ITEMS = 1000
SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_items (
    batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    inputs TEXT NOT NULL,
    external_reference TEXT,
    status TEXT NOT NULL,            -- queued, running, done
    success INTEGER,
    answer TEXT,                     -- the item's result, or its errors
    finished_at REAL,
    PRIMARY KEY (batch_id, idx)
);
CREATE INDEX IF NOT EXISTS batch_items_queued ON batch_items (status, batch_id, idx);
"""

# Runs one item: (account_id, model, inputs) → (success, its result or its errors); raises
# RetryLater when there is no capacity for it now.
RunItem = Callable[[str, str, dict[str, Any]], Awaitable[tuple[bool, Any]]]


class RetryLater(Exception):
    """No node can take the item now (429/503): it goes back to the queue."""


@dataclass(slots=True)
class QueuedItem:
    batch_id: str
    idx: int
    account_id: str
    model: str
    inputs: dict[str, Any]


class BatchStore:
    def __init__(self, db: Database, retention_s: float) -> None:
        self.db = db
        self.retention_s = retention_s
        with db.transaction():
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            # A restart between taking an item and finishing it: run it again.
            db.execute("UPDATE batch_items SET status = 'queued' WHERE status = 'running'")

    def enqueue(self, account_id: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
        requests = body.get("requests")
        if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_ITEMS:
            raise InvalidInputError(f"requests must be a list of 1 to {MAX_ITEMS} inputs",
                                    field="requests")
        for i, item in enumerate(requests):
            if not isinstance(item, dict):
                raise InvalidInputError(f"requests[{i}] must be an object", field="requests")
            if item.get("stream"):  # an answer kept for polling is one whole answer
                raise InvalidInputError(f"requests[{i}] cannot stream", field="requests")
        batch_id = str(uuid.uuid4())
        with self.db.transaction():
            self.db.execute("INSERT INTO batches VALUES (?, ?, ?, ?)",
                            (batch_id, account_id, model, time.time()))
            for i, item in enumerate(requests):
                reference = item.get("external_reference")
                inputs = {k: v for k, v in item.items() if k != "external_reference"}
                self.db.execute(
                    "INSERT INTO batch_items (batch_id, idx, inputs, external_reference, "
                    "status) VALUES (?, ?, ?, ?, 'queued')",
                    (batch_id, i, json.dumps(inputs),
                     None if reference is None else str(reference)))
        return {"status": "queued", "request_id": batch_id, "model": model}

    def poll(self, account_id: str, batch_id: str) -> dict[str, Any]:
        """Pending: its status; done: every item's answer and the summed usage."""
        [batch] = self.db.query("SELECT model FROM batches WHERE id = ? AND account_id = ?",
                                (str(batch_id), account_id)) or [None]
        if batch is None:  # or another account's: the same answer
            raise NotFoundError(f"no batch request {batch_id}", field="request_id")
        items = self.db.query("SELECT * FROM batch_items WHERE batch_id = ? ORDER BY idx",
                              (batch_id,))
        statuses = {row["status"] for row in items}
        if statuses != {"done"}:
            status = "running" if statuses & {"running", "done"} else "queued"
            return {"status": status, "request_id": batch_id, "model": batch["model"]}
        responses, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for row in items:
            answer = json.loads(row["answer"])
            entry = {"id": row["idx"], "success": bool(row["success"]),
                     "external_reference": row["external_reference"]}
            entry |= {"result": answer} if row["success"] else {"errors": answer}
            responses.append(entry)
            if row["success"] and isinstance(answer, dict):
                for key in usage:
                    usage[key] += (answer.get("usage") or {}).get(key, 0)
        return {"responses": responses, "usage": usage}

    def take(self) -> QueuedItem | None:
        """The oldest queued item, marked running."""
        with self.db.transaction():
            rows = self.db.query(
                "SELECT i.batch_id, i.idx, i.inputs, b.account_id, b.model FROM batch_items i "
                "JOIN batches b ON b.id = i.batch_id WHERE i.status = 'queued' "
                "ORDER BY b.created_at, i.idx LIMIT 1")
            if not rows:
                return None
            row = rows[0]
            self.db.execute("UPDATE batch_items SET status = 'running' "
                            "WHERE batch_id = ? AND idx = ?", (row["batch_id"], row["idx"]))
        return QueuedItem(row["batch_id"], row["idx"], row["account_id"], row["model"],
                          json.loads(row["inputs"]))

    def requeue(self, item: QueuedItem) -> None:
        self.db.execute("UPDATE batch_items SET status = 'queued' WHERE batch_id = ? AND idx = ?",
                        (item.batch_id, item.idx))

    def finish(self, item: QueuedItem, success: bool, answer: Any) -> None:
        self.db.execute("UPDATE batch_items SET status = 'done', success = ?, answer = ?, "
                        "finished_at = ? WHERE batch_id = ? AND idx = ?",
                        (int(success), json.dumps(answer), time.time(), item.batch_id,
                         item.idx))

    def purge(self, now: float | None = None) -> int:
        """Drop batches whose every answer is older than the retention time."""
        cutoff = (now or time.time()) - self.retention_s
        return self.db.execute(
            "DELETE FROM batches WHERE id IN (SELECT batch_id FROM batch_items GROUP BY "
            "batch_id HAVING SUM(status != 'done') = 0 AND MAX(finished_at) < ?)", (cutoff,))


class BatchWorker:
    """Runs queued items one at a time, after interactive traffic."""

    def __init__(self, store: BatchStore, run_item: RunItem, busy: Callable[[], bool],
                 idle_poll_s: float = 0.5, max_yield_s: float = 5.0,
                 retry_after_s: float = 1.0) -> None:
        self.store = store
        self.run_item = run_item
        self.busy = busy  # a node has interactive requests waiting
        self.idle_poll_s = idle_poll_s
        self.max_yield_s = max_yield_s  # then run anyway: batch work is later, not never
        self.retry_after_s = retry_after_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch-worker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            item = await asyncio.to_thread(self.store.take)
            if item is None:
                await asyncio.to_thread(self.store.purge)
                await asyncio.sleep(self.idle_poll_s)
                continue
            deadline = time.monotonic() + self.max_yield_s
            while self.busy() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            try:
                success, answer = await self._run(item)
            except RetryLater:
                await asyncio.to_thread(self.store.requeue, item)
                await asyncio.sleep(self.retry_after_s)
                continue
            # Cancelled meanwhile: the item stays running and the next start queues it again.
            await asyncio.to_thread(self.store.finish, item, success, answer)

    async def _run(self, item: QueuedItem) -> tuple[bool, Any]:
        try:
            return await self.run_item(item.account_id, item.model, item.inputs)
        except RetryLater:
            raise
        except Exception:  # one bad item must not stop the queue
            log.exception("batch %s item %d failed", item.batch_id, item.idx)
            return False, [{"code": 3001, "message": "Internal server error"}]
