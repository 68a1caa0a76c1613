"""The synchronous engine core: validate and queue requests, run steps, emit outputs."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from edgefire.contract.errors import ContextLengthError, InvalidInputError
from edgefire.runtime.engine import deterministic
from edgefire.runtime.engine.kv_pool import KVBackendFactory
from edgefire.runtime.engine.model_runner import CausalLM, ModelRunner, kv_bytes_per_block
from edgefire.runtime.engine.output_processor import OutputProcessor
from edgefire.runtime.engine.outputs import RequestOutput
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.engine.remote_kv import pages as kv_pages
from edgefire.runtime.engine.remote_kv.page_format import PageLayout
from edgefire.runtime.engine.remote_kv.pages import Page
from edgefire.runtime.engine.remote_kv.tier import RemoteTier
from edgefire.runtime.engine.sampler import Sampler
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from edgefire.runtime.engine.sequence import Sequence
from edgefire.runtime.engine.speculative import MODES, SpeculativeConfig, Speculator
from edgefire.runtime.engine.stats import EngineStats
from edgefire.runtime.engine.structured import Grammars
from edgefire.runtime.tokenizer import Tokenizer


@dataclass(slots=True)
class EngineConfig:
    max_model_len: int = 8192
    block_size: int = 16
    kv_cache_bytes: int = 1 << 30  # the KV pool is sized from this budget
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_prefix_caching: bool = True
    # The KV backend plugin that provides the page pool: edgefire.runtime.loading resolves the
    # name and hands the engine its factory.
    kv_backend: str = "local_paged"
    # What a KV store's keys are scoped to (model, weights digest, page layout); loading
    # sets it. Pages of another namespace are never read.
    kv_namespace: str = ""
    dtype: str = "auto"  # "float32", "bfloat16", or "auto": chosen per step by its token count
    auto_bfloat16_min_tokens: int = 8
    # Which requests run batch-invariant (runtime/engine/deterministic.py): off, seeded, all.
    deterministic: str = "off"
    # Speculative decoding (runtime/engine/speculative.py): ngram, off.
    speculative: str = "ngram"
    num_speculative_tokens: int = 3

    @property
    def precision(self) -> Precision:
        return Precision.parse(self.dtype, self.auto_bfloat16_min_tokens)


def _invariant_rows(model: CausalLM, precision: Precision) -> int:
    """Decode rows the model computes independently of each other in one step, when every
    step of up to that many rows runs in one dtype; 0 (no drafts) for models without it."""
    rows = getattr(model, "batch_invariant_decode_rows", None)
    if rows is None:
        return 0
    dtype = precision.for_step(1, decodes_only=True)
    limit = rows(dtype)
    return limit if all(precision.for_step(n, decodes_only=True) == dtype
                        for n in range(1, limit + 1)) else 0


class StepFailedError(RuntimeError):
    """A step raised (the cause is chained). Its requests were dropped, their KV freed; the
    engine is consistent and goes on with the others."""

    def __init__(self, request_ids: list[str]) -> None:
        super().__init__(f"a step failed; dropped its {len(request_ids)} request(s)")
        self.request_ids = request_ids


class ModelLostError(RuntimeError):
    """The model can run no more steps (a worker process of a parallel layout died or stopped
    answering). Unlike a failed step, the engine cannot go on: every request in flight fails
    and the node loads the model again on its next request."""


class LLMEngine:
    def __init__(self, model: CausalLM, tokenizer: Tokenizer, config: EngineConfig,
                 vocab_size: int, create_pool: KVBackendFactory) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        num_blocks = config.kv_cache_bytes // kv_bytes_per_block(model, config.block_size)
        if num_blocks < 1:
            raise ValueError(f"kv_cache_bytes={config.kv_cache_bytes} holds no KV block")
        # Steps use the pool the backend returns directly, never the factory again.
        pool = create_pool(num_blocks, config.block_size,
                           model.kv_cache_shape(num_blocks, config.block_size), model.kv_dtype,
                           config.enable_prefix_caching)
        self.blocks = pool.blocks
        self.page_layout = PageLayout.of_cache(pool.cache)
        self.remote: RemoteTier | None = None
        if pool.store is not None:
            self.remote = RemoteTier(pool.store, self.page_layout, config.kv_namespace,
                                     pool.codec)
            self.blocks.published = []
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens), self.blocks)
        self.runner = ModelRunner(model, pool.cache, config.block_size, config.precision,
                                  _invariant_rows(model, config.precision))
        self.sampler = Sampler()
        self.outputs = OutputProcessor(tokenizer)
        self.requests: dict[str, Sequence] = {}
        self.stop_token_ids = frozenset(tokenizer.stop_token_ids)
        self.grammars = Grammars(tokenizer, vocab_size)
        self.policy = deterministic.Policy.parse(config.deterministic)
        if config.speculative not in MODES:
            raise ValueError(f"speculative must be one of {', '.join(MODES)}")
        self.speculator = Speculator(SpeculativeConfig(
            mode=config.speculative, num_draft_tokens=config.num_speculative_tokens,
            max_rows=_invariant_rows(model, config.precision)))

    @property
    def kv_pool_bytes(self) -> int:
        """Bytes the KV pages take, a parallel layout's workers' included (at most
        config.kv_cache_bytes, the budget)."""
        return self.blocks.num_blocks * kv_bytes_per_block(self.runner.model,
                                                           self.config.block_size)

    def stats(self) -> EngineStats:
        """The engine's load now; any thread may call it. It reads list lengths and ints, each
        whole, and takes no lock: the fields may be a step apart, never torn."""
        blocks, scheduler = self.blocks, self.scheduler
        return EngineStats(
            num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
            num_kv_blocks_used=blocks.num_blocks - blocks.num_free_blocks,
            num_kv_blocks=blocks.num_blocks,
            num_prefix_queried_tokens=blocks.num_prefix_queried_tokens,
            num_prefix_hit_tokens=blocks.num_prefix_hit_tokens,
            num_prefix_remote_hit_tokens=blocks.num_prefix_remote_hit_tokens,
            num_preemptions=scheduler.num_preemptions,
            num_draft_tokens=self.speculator.num_proposed,
            num_accepted_draft_tokens=self.speculator.num_accepted)

    # The remote tier (runtime/engine/remote_kv/tier.py), when the KV backend has a store.
    def prefix_hashes(self, seq: Sequence) -> list[bytes]:
        """Chain hashes of the blocks of seq a prefix hit may cover (block_manager's
        prefix_hashes); kept on seq. Any thread may call it for a sequence not yet queued."""
        self.blocks.update_hashes(seq)
        return seq.block_hashes[:(seq.num_tokens - 1) // self.blocks.block_size]

    def lookup_remote(self, seq: Sequence) -> list[Page]:
        """Pages of seq's prefix the local pool misses and the store has, for install_pages;
        off the compute thread (it waits on the store)."""
        if self.remote is None or not self.config.enable_prefix_caching:
            return []
        return self.remote.lookup(self.blocks.cached, self.prefix_hashes(seq))

    def install_pages(self, pages: list[Page]) -> int:
        """Put pages (looked up, or handed over by a prefill node) into the pool as cached
        blocks; on the compute thread, before the request they serve is queued."""
        if not pages or not self.config.enable_prefix_caching:
            return 0
        return kv_pages.install(self.blocks, self.runner.kv_cache, self.page_layout, pages)

    def export_pages(self, hashes: list[bytes]) -> list[bytes]:
        """Page records of the longest cached run of hashes; on the compute thread."""
        return kv_pages.export(self.blocks, self.runner.kv_cache, self.page_layout, hashes)

    def accept_records(self, hashes: list[bytes], records: list[bytes | None]) -> list[Page]:
        """The leading records that are whole pages of hashes (a prefill node's answer)."""
        return kv_pages.accept(self.page_layout, hashes, records)[0]

    @property
    def model_lost(self) -> bool:
        """Whether the model can run no more steps (a parallel layout's worker died)."""
        return bool(getattr(self.runner.model, "lost", False))

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        close_model = getattr(self.runner.model, "close", None)
        if close_model is not None:  # a parallel layout's worker processes
            close_model()

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams, salt: bytes = b"") -> Sequence:
        """Validate and queue a request; raises InvalidInputError without touching the batch."""
        if request_id in self.requests:
            raise InvalidInputError(f"request id {request_id!r} is already running",
                                    field="request_id")
        seq = self.prepare(request_id, prompt_token_ids, params, salt)
        self.enqueue(seq)
        return seq

    def prepare(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                salt: bytes = b"") -> Sequence:
        """Validate a request into a Sequence; reads only constants, so any thread may call it."""
        params.validate(self.vocab_size)
        self._check_prompt(prompt_token_ids, params)
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        det = self.policy.applies(params.seed, params.deterministic)
        if det and not self.runner.row_blocks:
            raise InvalidInputError("this model cannot run deterministically: its forward and "
                                    "compute_logits take no row_block", field="deterministic")
        seq = Sequence(request_id, list(prompt_token_ids), len(prompt_token_ids), params,
                       generator, salt + deterministic.SALT_SUFFIX if det else salt,
                       deterministic=det)
        if params.json_schema is not None:
            seq.constraint = self.grammars.json_schema(params.json_schema,
                                                       params.json_schema_field)
        return seq

    def enqueue(self, seq: Sequence) -> None:
        self.requests[seq.request_id] = seq
        self.outputs.add(seq)
        self.scheduler.add(seq)

    def _check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise InvalidInputError("prompt is empty", field="prompt")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids):
            raise InvalidInputError(f"prompt token ids must be in [0, {self.vocab_size})",
                                    field="prompt")
        limit = self.config.max_model_len
        if len(ids) >= limit:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens; the model's context window is {limit} tokens",
                field="prompt")
        # A request must fit the KV pool on its own, or preemption could never make room for it.
        need = self.blocks.num_blocks_for(min(len(ids) + params.max_tokens, limit))
        if need > self.blocks.num_blocks:
            raise ContextLengthError(
                f"prompt plus max_tokens needs {need} KV blocks; this node's pool has "
                f"{self.blocks.num_blocks}", field="max_tokens")

    def abort(self, request_id: str) -> None:
        """Drop a request and free its KV blocks now; unknown or finished ids are ignored."""
        seq = self.requests.pop(request_id, None)
        if seq is not None:
            self.scheduler.finish(seq, "abort")
            self.outputs.remove(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one step. If running the batch raises, its requests are dropped and
        StepFailedError names them; a failure anywhere else (scheduling, or dropping them)
        leaves the engine in an unknown state and propagates as it is, as does ModelLostError."""
        self.speculator.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        self._withdraw_unverified(batch)
        if not batch.seqs:
            return []
        try:
            return self._run(batch)
        except ModelLostError:
            raise
        except Exception as exc:
            # Each sequence is finished whole: KV written this step belongs to its own blocks
            # (shared prefix blocks are never written) and is freed with them.
            request_ids = [seq.request_id for seq in batch.seqs]
            for request_id in request_ids:
                self.abort(request_id)
            raise StepFailedError(request_ids) from exc

    def _withdraw_unverified(self, batch: ScheduledBatch) -> None:
        """Drafts stay only on sequences scheduled with all of them (the scheduler may have
        preempted a sequence, or cut its tokens to the budget)."""
        scheduled = dict(zip(batch.seqs, range(len(batch.seqs)), strict=True))
        for seq in [*self.scheduler.running, *batch.preempted]:
            i = scheduled.get(seq)
            if seq.num_draft and (i is None or batch.num_scheduled_tokens[i] != 1 + seq.num_draft):
                self.speculator.withdraw([seq])
                if i is not None:
                    batch.num_scheduled_tokens[i] = 1

    def _run(self, batch: ScheduledBatch) -> list[RequestOutput]:
        sample_seqs, logits = self.runner.execute(batch)
        new_tokens: dict[Sequence, list[int]] = {}
        for seq, token in zip(sample_seqs, self.sampler(logits, sample_seqs), strict=True):
            new_tokens.setdefault(seq, []).append(token)
        for seq, n in zip(batch.seqs, batch.num_scheduled_tokens, strict=True):
            if seq.num_draft:
                # Only the real last token counts as computed now; the drafts that stand
                # are counted as they are appended below.
                new_tokens[seq] = self.speculator.accept(seq, new_tokens[seq])
                n = 1
            seq.num_computed_tokens += n
            self.blocks.cache_full_blocks(seq, deterministic.publishable_blocks(
                seq, self.scheduler.chunk, self.blocks.block_size) if seq.deterministic else None)
        if self.remote is not None and self.blocks.published:
            self.remote.publish(self.runner.kv_cache, self.blocks.published)
            self.blocks.published = []
        outputs = []
        for seq, tokens in new_tokens.items():
            output: RequestOutput | None = None
            for i, token in enumerate(tokens):
                seq.num_computed_tokens += i > 0  # the previous token's K/V came as a draft
                step = self._append(seq, token)
                output = step if output is None else output.then(step)
                if step.finished:
                    break
            assert output is not None
            outputs.append(output)
        return outputs

    def _append(self, seq: Sequence, token: int) -> RequestOutput:
        seq.token_ids.append(token)
        if seq.constraint is not None:
            seq.constraint.advance(token)
        output = self.outputs.update(seq, token, self._finish_reason(seq, token))
        if output.finished:
            self.scheduler.finish(seq, output.finish_reason)
            del self.requests[seq.request_id]
        return output

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if not p.ignore_eos and token in self.stop_token_ids or token in p.stop_token_ids:
            return "stop"
        if seq.constraint is not None and seq.constraint.complete:
            return "stop"  # the JSON value is whole: only a stop token could follow
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return "length"
        return None
