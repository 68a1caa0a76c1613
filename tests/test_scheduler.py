"""Continuous batching: token budget, chunked prefill, max_num_seqs, FCFS and preemption.

The model is simulated: each scheduled sequence's computed count advances by what was
scheduled, and a sequence that caught up with its known tokens "samples" a dummy token, as
LLMEngine.step does.
"""

from __future__ import annotations

import itertools

import torch

from edgefire.runtime.engine.block_manager import BlockManager
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from edgefire.runtime.engine.sequence import Sequence, SequenceStatus

BS = 4
DUMMY = 7
_ids = itertools.count()


def make_seq(num_prompt: int, max_tokens: int = 8, name: str | None = None,
             first: int = 1) -> Sequence:
    tokens = list(range(first, first + num_prompt))
    return Sequence(name or f"r{next(_ids)}", tokens, num_prompt,
                    SamplingParams(max_tokens=max_tokens), torch.Generator())


def make_scheduler(num_blocks: int = 64, budget: int = 64, max_seqs: int = 16,
                   prefix_caching: bool = False) -> Scheduler:
    return Scheduler(SchedulerConfig(max_seqs, budget),
                     BlockManager(num_blocks, BS, prefix_caching))


def step(sched: Scheduler) -> ScheduledBatch:
    """One engine step with a fake model; checks the scheduler's invariants on the way."""
    batch = sched.schedule()
    assert batch.num_batched_tokens <= sched.config.max_num_batched_tokens
    assert len(sched.running) <= sched.config.max_num_seqs
    assert len({id(s) for s in batch.seqs}) == len(batch.seqs)
    for seq, n in zip(batch.seqs, batch.num_scheduled_tokens, strict=True):
        assert n >= 1
        assert seq.status is SequenceStatus.RUNNING and seq in sched.running
        assert seq.num_computed_tokens + n <= seq.num_tokens
        # The runner writes K/V for every scheduled position through the block table.
        assert len(seq.block_table) >= sched.blocks.num_blocks_for(seq.num_computed_tokens + n)
    for seq in batch.preempted:
        assert seq.status is SequenceStatus.WAITING and seq.block_table == []
    for seq, n in zip(batch.seqs, batch.num_scheduled_tokens, strict=True):
        seq.num_computed_tokens += n
        sched.blocks.cache_full_blocks(seq)
    for seq in batch.seqs:
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(DUMMY)
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq, "length")
    return batch


def scheduled(batch: ScheduledBatch) -> dict[str, int]:
    return {s.request_id: n for s, n in zip(batch.seqs, batch.num_scheduled_tokens, strict=True)}


def run_to_completion(sched: Scheduler, limit: int = 10_000) -> list[ScheduledBatch]:
    batches = []
    while sched.has_unfinished():
        batches.append(step(sched))
        assert len(batches) < limit, "scheduler made no progress"
    return batches


def assert_drained(sched: Scheduler) -> None:
    bm = sched.blocks
    assert not sched.running and not sched.waiting
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_single_request_prefill_then_decode() -> None:
    sched = make_scheduler()
    seq = make_seq(10, max_tokens=3, name="a")
    sched.add(seq)
    batches = run_to_completion(sched)
    assert [scheduled(b) for b in batches] == [{"a": 10}, {"a": 1}, {"a": 1}]
    assert seq.is_finished and seq.finish_reason == "length"
    assert seq.output_token_ids == [DUMMY] * 3
    assert_drained(sched)


def test_token_budget_respected() -> None:
    sched = make_scheduler(num_blocks=256, budget=20)
    seqs = [make_seq(n, max_tokens=5) for n in (3, 17, 40, 8, 25, 1, 19)]
    for seq in seqs:
        sched.add(seq)
    batches = run_to_completion(sched)
    assert all(b.num_batched_tokens <= 20 for b in batches)
    # Each step used the whole budget while there was prompt work left to fill it.
    total_prompt = sum(s.num_prompt_tokens for s in seqs)
    assert batches[0].num_batched_tokens == 20
    assert sum(b.num_batched_tokens for b in batches) == total_prompt + sum(
        s.num_output_tokens - 1 for s in seqs)
    assert all(s.num_output_tokens == 5 for s in seqs)
    assert_drained(sched)


def test_chunked_prefill_splits_long_prompt_and_mixes_with_decodes() -> None:
    sched = make_scheduler(num_blocks=64, budget=16)
    short = make_seq(6, max_tokens=20, name="short")
    long = make_seq(50, max_tokens=2, name="long")
    sched.add(short)
    sched.add(long)
    b1 = step(sched)
    assert scheduled(b1) == {"short": 6, "long": 10}
    assert long.num_computed_tokens == 10 and long.num_output_tokens == 0
    b2 = step(sched)
    assert scheduled(b2) == {"short": 1, "long": 15}  # a decode rides along with a chunk
    b3 = step(sched)
    assert scheduled(b3) == {"short": 1, "long": 15}
    b4 = step(sched)
    assert scheduled(b4) == {"short": 1, "long": 10}  # the last chunk samples
    assert long.num_output_tokens == 1
    b5 = step(sched)
    assert scheduled(b5) == {"short": 1, "long": 1}
    assert long.is_finished
    chunks = [scheduled(b)["long"] for b in (b1, b2, b3, b4)]
    assert sum(chunks) == 50
    run_to_completion(sched)
    assert short.num_output_tokens == 20
    assert_drained(sched)


def test_running_requests_go_before_new_ones() -> None:
    sched = make_scheduler(budget=8)
    a = make_seq(8, max_tokens=4, name="a")
    sched.add(a)
    step(sched)
    b = make_seq(30, name="b")
    sched.add(b)
    batch = step(sched)
    assert batch.seqs[0] is a and scheduled(batch) == {"a": 1, "b": 7}


def test_max_num_seqs_respected() -> None:
    sched = make_scheduler(max_seqs=3)
    seqs = [make_seq(4, max_tokens=2 + i) for i in range(5)]
    for seq in seqs:
        sched.add(seq)
    b1 = step(sched)
    assert b1.seqs == seqs[:3]
    assert list(sched.waiting) == seqs[3:]
    b2 = step(sched)
    assert b2.seqs == seqs[:3]
    assert seqs[0].is_finished  # max_tokens 2
    b3 = step(sched)
    assert b3.seqs == [seqs[1], seqs[2], seqs[3]]  # one slot freed, one admission
    batches = run_to_completion(sched)
    assert all(len(b.seqs) <= 3 for b in batches)
    assert all(s.is_finished for s in seqs)
    assert_drained(sched)


def test_fcfs_admission_order() -> None:
    sched = make_scheduler(budget=1000)
    seqs = [make_seq(n) for n in (5, 30, 2, 17, 9)]
    for seq in seqs:
        sched.add(seq)
    batch = step(sched)
    assert batch.seqs == seqs
    assert sched.running == seqs


def test_fcfs_head_of_line_is_not_jumped() -> None:
    # The head request does not fit the free blocks yet: smaller later arrivals wait behind it.
    sched = make_scheduler(num_blocks=10, budget=1000)
    hog = make_seq(24, max_tokens=3, name="hog")  # 6 blocks
    sched.add(hog)
    step(sched)
    big = make_seq(20, name="big")  # 5 blocks: does not fit beside the hog's 6 (+1 for decode)
    small = make_seq(2, name="small")
    sched.add(big)
    sched.add(small)
    batch = step(sched)
    assert scheduled(batch) == {"hog": 1}
    assert list(sched.waiting) == [big, small]
    run_to_completion(sched)
    assert big.is_finished and small.is_finished
    assert_drained(sched)


def test_chunk_limited_by_budget_admits_in_order() -> None:
    sched = make_scheduler(budget=10)
    a, b = make_seq(25, name="a"), make_seq(3, name="b")
    sched.add(a)
    sched.add(b)
    assert scheduled(step(sched)) == {"a": 10}  # budget spent: b waits its turn
    assert list(sched.waiting) == [b]


def test_preemption_frees_latest_and_requeues_it_first() -> None:
    # 8 blocks of 4 tokens: two 8-token prompts fit (4 blocks) and grow to 16 tokens each.
    sched = make_scheduler(num_blocks=8, budget=64)
    a = make_seq(8, max_tokens=12, name="a")
    b = make_seq(8, max_tokens=12, name="b", first=100)
    sched.add(a)
    sched.add(b)
    late = make_seq(3, max_tokens=1, name="late", first=300)
    preempted_at = None
    for i in range(20):
        if i == 1:
            sched.add(late)
        batch = step(sched)
        if batch.preempted:
            preempted_at = i
            break
    assert preempted_at is not None
    assert batch.preempted == [b]  # the latest-admitted running request
    assert sched.num_preemptions == 1
    assert b.status is SequenceStatus.WAITING
    assert b.block_table == [] and b.num_computed_tokens == 0
    assert sched.waiting[0] is b  # ahead of requests that never ran
    assert b not in sched.running
    assert scheduled(batch) == {"a": 1}
    # Nothing else is admitted in a step that preempted.
    assert all(s.status is not SequenceStatus.WAITING for s in batch.seqs)
    outputs_at_preemption = b.num_output_tokens
    assert outputs_at_preemption > 0

    # Resume: once room frees up, b recomputes prompt and outputs so far in one prefill.
    resumed = None
    while sched.has_unfinished():
        batch = step(sched)
        if b in batch.seqs and resumed is None:
            resumed = scheduled(batch)["b"]
    assert resumed == 8 + outputs_at_preemption
    assert a.is_finished and b.is_finished and late.is_finished
    assert b.num_output_tokens == 12
    assert b.output_token_ids == [DUMMY] * 12
    assert b.num_cached_tokens == 0
    assert_drained(sched)


def test_latest_request_preempts_itself_when_it_cannot_grow() -> None:
    sched = make_scheduler(num_blocks=4, budget=64)
    a = make_seq(4, max_tokens=12, name="a")  # each fits the pool alone (16 tokens)
    b = make_seq(8, max_tokens=8, name="b", first=50)
    sched.add(a)
    sched.add(b)
    assert scheduled(step(sched)) == {"a": 4, "b": 8}  # 3 of 4 blocks
    batch = step(sched)  # a takes the last block; b, the latest, has none left to grow into
    assert batch.preempted == [b] and scheduled(batch) == {"a": 1}
    assert list(sched.waiting) == [b] and sched.running == [a]
    run_to_completion(sched, limit=500)
    assert a.num_output_tokens == 12 and b.num_output_tokens == 8
    assert sched.num_preemptions == 1
    assert_drained(sched)


def test_many_requests_tight_pool_all_finish() -> None:
    sched = make_scheduler(num_blocks=12, budget=24, max_seqs=6)
    seqs = [make_seq(3 + 5 * i % 17, max_tokens=6 + i % 5, first=10 * i) for i in range(10)]
    for seq in seqs:
        sched.add(seq)
    run_to_completion(sched)
    assert sched.num_preemptions > 0
    assert all(s.is_finished and s.num_output_tokens == s.params.max_tokens for s in seqs)
    assert_drained(sched)


def test_prefix_cache_hit_on_admission() -> None:
    sched = make_scheduler(num_blocks=32, budget=64, prefix_caching=True)
    first = make_seq(13, max_tokens=1, name="first")
    sched.add(first)
    run_to_completion(sched)
    second = make_seq(13, max_tokens=2, name="second")
    sched.add(second)
    batch = step(sched)
    assert scheduled(batch) == {"second": 1}  # 3 blocks cached; the last token is computed
    assert second.num_cached_tokens == 12
    assert sched.blocks.num_prefix_hit_tokens == 12
    assert sched.blocks.num_prefix_queried_tokens == 26
    run_to_completion(sched)
    assert_drained(sched)


def test_prefix_cache_hit_with_uncached_tail() -> None:
    # Prompt = cached prefix + new tokens: the blocks must cover the whole prompt.
    sched = make_scheduler(num_blocks=32, budget=64, prefix_caching=True)
    sched.add(make_seq(9, max_tokens=1))
    run_to_completion(sched)
    seq = make_seq(30, max_tokens=3, name="tail")  # shares the first two blocks
    sched.add(seq)
    batch = step(sched)
    assert scheduled(batch) == {"tail": 22}
    assert seq.num_cached_tokens == 8
    run_to_completion(sched)
    assert_drained(sched)


def test_finish_and_abort_from_waiting() -> None:
    sched = make_scheduler(max_seqs=1)
    a, b = make_seq(4), make_seq(4)
    sched.add(a)
    sched.add(b)
    step(sched)
    sched.finish(b, "abort")  # still waiting
    assert b.is_finished and b.finish_reason == "abort" and not sched.waiting
    sched.finish(a, "abort")
    sched.finish(a, "abort")  # idempotent
    assert_drained(sched)


def test_a_deterministic_sequence_steps_on_its_grid_whatever_the_others_take():
    # budget 32, block 4: grid chunks of 16. Another request ahead takes part of the budget;
    # the deterministic one is never cut to what is left, it waits for its whole chunk.
    sched = make_scheduler(budget=32)
    other, det = make_seq(20), make_seq(70, max_tokens=3)
    det.deterministic = True
    sched.add(other)
    sched.add(det)
    steps = []
    while det in sched.running or det in sched.waiting:
        batch = step(sched)
        steps += [n for seq, n in zip(batch.seqs, batch.num_scheduled_tokens, strict=True)
                  if seq is det]
    assert steps == [16, 16, 16, 16, 6, 1, 1]
