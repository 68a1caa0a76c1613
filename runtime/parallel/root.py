"""The root rank: a parallel layout's model as the engine sees it, in the node's process.

The scheduler and the sampler stay here. Each step the root sends the batch to every worker
over its pipe, runs its own shard (the ranks meet in the collectives), then gathers the
logits of the rows to sample. A worker that died or stopped answering makes the model lost
(ModelLostError): the engine fails its requests and the node loads the model again.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import torch

from edgefire.contract.errors import ModelUnavailableError
from edgefire.models.attention import AttentionMetadata
from edgefire.models.tensor_parallel import split
from edgefire.runtime.engine.llm_engine import ModelLostError
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading.loaded import LoadedLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel import messages
from edgefire.runtime.parallel.collectives import ROOT, Collectives, free_port
from edgefire.runtime.parallel.strategy import ParallelStrategy
from edgefire.runtime.parallel.threads import RankThreads
from edgefire.runtime.parallel.worker import WorkerArgs, run

log = logging.getLogger(__name__)

# Each collective and a worker's start-up wait at most this long (seconds).
TIMEOUT_S = float(os.environ.get("EDGEFIRE_PARALLEL_TIMEOUT_S", "60"))
# Bind each rank to its own cores (the node's process included): for benches and nodes that
# run nothing else.
PIN = os.environ.get("EDGEFIRE_PARALLEL_PIN", "0") == "1"


def launch(loaded: LoadedLM, layout: ParallelLayout, precision: Precision,
           strategy: ParallelStrategy) -> LoadedLM:
    """loaded served in layout by strategy: workers started and joined, the model replaced by
    the root rank's ParallelLM. Raises ModelUnavailableError where it cannot be."""
    world = layout.world_size
    threads = RankThreads.plan(world, PIN)
    vocab_ranks = strategy.vocab_ranks(layout)
    widths = [len(split(loaded.vocab_size, vocab_ranks, r)) for r in range(vocab_ranks)]
    try:
        plan = strategy.plan(loaded.model, layout)
    except ValueError as exc:
        raise ModelUnavailableError(f"{loaded.spec.id} cannot run with parallel "
                                    f"{layout}: {exc}", field="model") from exc
    port = free_port()
    ctx = mp.get_context("spawn")  # a fork would copy the node's threads and locks
    workers: list[tuple[mp.process.BaseProcess, Connection]] = []
    try:
        for rank in range(1, world):
            here, there = ctx.Pipe()
            args = WorkerArgs(loaded.spec, precision, layout, rank, port, TIMEOUT_S, threads,
                              widths, plan)
            process = ctx.Process(target=run, args=(args, there), daemon=True,
                                  name=f"edgefire-rank{rank}")
            process.start()
            there.close()
            workers.append((process, here))
        if PIN:
            threads.apply(ROOT)
        comm = Collectives.connect(port, ROOT, world, TIMEOUT_S)
        shard = strategy.shard(loaded.model, ROOT, layout, comm, plan)
        logits_comm = comm.subgroup(range(vocab_ranks))  # the workers join it as they start
        ready = [_ready(process, conn) for process, conn in workers]
    except (ValueError, ModelLostError) as exc:
        _stop(workers)
        raise ModelUnavailableError(f"{loaded.spec.id} cannot run with parallel "
                                    f"{layout}: {exc}", field="model") from exc
    except BaseException:
        _stop(workers)
        raise
    model = ParallelLM(shard, comm, workers, ready,
                       (logits_comm, widths) if vocab_ranks > 1 else None)
    return replace(loaded, model=model)


class SpawnedStrategy:
    """What the built-in strategies share: launched by launch() above, with no plan unless
    they make one, and the logits computed whole on the root unless they say otherwise."""

    def vocab_ranks(self, layout: ParallelLayout) -> int:
        return 1

    def launch(self, loaded: LoadedLM, layout: ParallelLayout,
               precision: Precision) -> LoadedLM:
        return launch(loaded, layout, precision, self)

    def plan(self, model: CausalLM, layout: ParallelLayout) -> Any:
        return None  # every rank's part follows from its rank alone


def _ready(process: mp.process.BaseProcess, conn: Connection) -> messages.Ready:
    """A worker's word that it has loaded its shard."""
    if not conn.poll(TIMEOUT_S):
        raise ModelLostError(f"{process.name} did not start in {TIMEOUT_S:.0f} s")
    try:
        message = messages.receive(conn)
    except EOFError:
        raise ModelLostError(f"{process.name} exited while starting") from None
    if isinstance(message, messages.Failed):
        raise ValueError(f"{process.name}: {message.error}")
    assert isinstance(message, messages.Ready)
    return message


def _stop(workers: list[tuple[mp.process.BaseProcess, Connection]]) -> None:
    for _, conn in workers:
        with contextlib.suppress(OSError):  # a worker already gone
            messages.send(conn, messages.Close())
        conn.close()
    for process, _ in workers:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


class ParallelLM:
    """A CausalLM whose steps run on every rank of a layout (the engine's model_runner calls
    it like any other)."""

    def __init__(self, shard: CausalLM, comm: Collectives,
                 workers: list[tuple[mp.process.BaseProcess, Connection]],
                 ready: list[messages.Ready], vocab: tuple[Collectives, list[int]] | None
                 ) -> None:
        """ready: what each worker said once loaded. vocab: the ranks holding slices of the
        vocabulary (the root and the first workers) and each one's columns of the logits,
        which the root gathers from them; None where the root computes them all (its shard
        holds the whole LM head)."""
        self.shard = shard
        self.comm = comm
        self.workers = workers
        self.vocab = vocab
        self.worker_bytes = sum(r.weight_bytes for r in ready)
        # The workers' KV pages, as many blocks as the root's: the engine sizes the pool so
        # that every rank's pages fit its budget (model_runner.kv_bytes_per_block).
        self.kv_bytes_per_token_elsewhere = sum(r.kv_bytes_per_token for r in ready)
        self.kv_dtype = shard.kv_dtype
        self.weight_precision = shard.weight_precision
        self._lost = False
        self._closed = False
        self._geometry: tuple[int, int] | None = None

    @property
    def lost(self) -> bool:
        """A worker died or a collective failed: the model runs no more steps."""
        return self._lost or not all(process.is_alive() for process, _ in self.workers)

    @property
    def weight_bytes(self) -> int:
        """All ranks' weights: the workers' live in their own processes on this machine."""
        return getattr(self.shard, "weight_bytes", 0) + self.worker_bytes

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """The root's pages (its heads); each worker holds as many blocks of its own."""
        return self.shard.kv_cache_shape(num_blocks, block_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv_cache: torch.Tensor,
                dtype: torch.dtype | None = None) -> torch.Tensor:
        # No row_block: deterministic mode's fixed row blocks are a one-process feature (the
        # engine refuses such requests for a model whose forward does not take them).
        dtype = dtype or self.shard.dtypes[0]
        self._broadcast(messages.Forward(input_ids, positions, meta, dtype,
                                         *self._pool_geometry(kv_cache)))
        return self._guarded(self.shard.forward, input_ids, positions, meta, kv_cache, dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.vocab is None:
            return self._guarded(self.shard.compute_logits, hidden)
        comm, widths = self.vocab
        if not hidden.shape[0]:  # a step of prompt chunks that end no prompt: nothing to sample
            return torch.empty(0, sum(widths))
        self._broadcast(messages.Logits(hidden), self.workers[:comm.world_size - 1])
        part = self._guarded(self.shard.compute_logits, hidden)
        logits = self._guarded(comm.gather_columns, part, widths)
        assert logits is not None  # the root gathers
        return logits

    def _pool_geometry(self, kv_cache: torch.Tensor) -> tuple[int, int]:
        """(blocks, block_size) of the root's pool, read off its shape at the dims the model's
        page layout puts them."""
        if self._geometry is None:
            probe = self.shard.kv_cache_shape(2, 3)
            base = self.shard.kv_cache_shape(1, 1)
            blocks_dim = next(i for i, (a, b) in enumerate(zip(probe, base, strict=True))
                              if a == 2 * b)
            size_dim = next(i for i, (a, b) in enumerate(zip(probe, base, strict=True))
                            if a == 3 * b)
            self._geometry = (kv_cache.shape[blocks_dim], kv_cache.shape[size_dim])
        return self._geometry

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _stop(self.workers)

    def _broadcast(self, message: messages.Message,
                   to: list[tuple[mp.process.BaseProcess, Connection]] | None = None) -> None:
        """message to every worker, or to those in `to`."""
        if self.lost:
            self._lost = True
            raise ModelLostError("a worker process of this model's parallel layout died")
        for process, conn in self.workers if to is None else to:
            try:
                messages.send(conn, message)
            except OSError as exc:
                self._lost = True
                raise ModelLostError(f"{process.name} is gone ({exc})") from exc

    def _guarded(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ModelLostError:
            self._lost = True
            raise
