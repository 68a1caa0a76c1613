"""What the root sends its workers each step, over one pipe per worker.

Plain pickle of the step's small tensors (ids, positions, slots, block tables): the default
multiprocessing pickler would move each through a new shared-memory segment.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from edgefire.models.attention import AttentionMetadata


@dataclass(slots=True)
class Forward:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    dtype: torch.dtype
    kv_blocks: int  # the root's pool: each rank holds as many blocks, of its own heads
    block_size: int


@dataclass(slots=True)
class Logits:
    hidden: torch.Tensor  # the rows to sample, as the root holds them


@dataclass(slots=True)
class Close:
    pass


@dataclass(slots=True)
class Ready:
    weight_bytes: int
    kv_bytes_per_token: int  # its pages' bytes per token (its layers and heads)


@dataclass(slots=True)
class Failed:
    error: str  # why a worker could not start


Message = Forward | Logits | Close | Ready | Failed


def send(conn: Connection, message: Message) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Message:
    return pickle.loads(conn.recv_bytes())
