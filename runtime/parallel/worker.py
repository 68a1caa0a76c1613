"""A parallel layout's worker process: one rank of one model, driven by the root's messages.

It joins the ranks' process group first (the root waits on it), loads the model and keeps
its own shard, then runs each step the root sends: its part of the forward pass, meeting the
other ranks in the collectives, and its part of the logits. A failure mid-step leaves the
ranks' collectives out of step, so the worker exits and the root takes the model offline.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from edgefire.contract.catalog import ModelSpec
from edgefire.runtime.engine.model_runner import CausalLM, kv_bytes_per_block
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import load_lm
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel import messages
from edgefire.runtime.parallel.collectives import Collectives
from edgefire.runtime.parallel.threads import RankThreads
from edgefire.runtime.plugins import load_plugins

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerArgs:
    spec: ModelSpec
    precision: Precision
    layout: ParallelLayout
    rank: int
    port: int
    timeout_s: float
    threads: RankThreads
    # The vocabulary's columns of the logits held by each of the first ranks, which the root
    # gathers from them; one where it computes them all.
    logit_widths: list[int]
    plan: Any  # the strategy's (ParallelStrategy.plan)


def run(args: WorkerArgs, conn: Connection) -> None:
    """The worker's entry point (a spawned process). It exits non-zero on any failure, so
    that the root sees it."""
    try:
        _serve(args, conn)
    except BaseException:
        log.exception("parallel worker rank %d failed", args.rank)
        os._exit(1)


def _serve(args: WorkerArgs, conn: Connection) -> None:
    args.threads.apply(args.rank)
    try:
        comm = Collectives.connect(args.port, args.rank, args.layout.world_size, args.timeout_s)
        model = _load_shard(args, comm)
        vocab_ranks = range(len(args.logit_widths))
        # Joined now, as the root does in launch(): it waits for every member.
        logits_comm = comm.subgroup(vocab_ranks) if args.rank in vocab_ranks else None
    except BaseException as exc:
        messages.send(conn, messages.Failed(f"{type(exc).__name__}: {exc}"))
        raise
    messages.send(conn, messages.Ready(model.weight_bytes, kv_bytes_per_block(model, 1)))
    kv_cache: torch.Tensor | None = None
    with torch.inference_mode():
        while True:
            try:
                message = messages.receive(conn)
            except EOFError:  # the root is gone
                return
            match message:
                case messages.Forward():
                    shape = model.kv_cache_shape(message.kv_blocks, message.block_size)
                    if kv_cache is None or kv_cache.shape != shape:
                        kv_cache = torch.zeros(shape, dtype=model.kv_dtype)
                    model.forward(message.input_ids, message.positions, message.meta, kv_cache,
                                  message.dtype)
                case messages.Logits():  # sent only to the ranks holding vocabulary slices
                    assert logits_comm is not None
                    part = model.compute_logits(message.hidden)
                    logits_comm.gather_columns(part, args.logit_widths)
                case messages.Close():
                    return


def _load_shard(args: WorkerArgs, comm: Collectives) -> CausalLM:
    strategy = load_plugins().parallel_strategies.get(args.layout.strategy)
    loaded = load_lm(args.spec, args.precision)
    return strategy.shard(loaded.model, args.rank, args.layout, comm, args.plan)

