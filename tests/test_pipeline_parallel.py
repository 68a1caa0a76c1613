"""Pipeline parallelism: the balancer, micro-batches that add up to the step, stages that add
up to the model, and the micro-batch pipeline over real Gloo between threads: two stages, and
two stages of two tensor-parallel lanes each."""

from __future__ import annotations

import threading

import pytest
import torch

from edgefire.models.attention import AttentionMetadata, PrefillSpan, micro_batches
from edgefire.models.llama import LlamaForCausalLM
from edgefire.models.pipeline_parallel import balance, stage_llama
from edgefire.models.tensor_parallel import split
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel.pipeline import PipelineRank
from edgefire.runtime.plugins import load_plugins
from tests.gloo_ranks import run_ranks
from tests.test_tensor_parallel import BLOCK, CONFIG, _weights

LAYERS = 4
MODEL_CONFIG = CONFIG.__class__(**{**{f: getattr(CONFIG, f) for f in CONFIG.__slots__},
                                   "num_layers": LAYERS})


def test_balance_splits_even_costs_evenly_and_weighs_the_first_stage_extra():
    assert balance([1.0] * 30, 2) == [range(0, 15), range(15, 30)]
    assert balance([1.0] * 30, 3) == [range(0, 10), range(10, 20), range(20, 30)]
    # the root's LM head costs as much as 8 layers: it keeps fewer
    assert balance([1.0] * 30, 2, first_extra=8.0) == [range(0, 11), range(11, 30)]
    assert balance([5.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2) == [range(0, 1), range(1, 6)]
    with pytest.raises(ValueError, match="3 layers cannot be split into 4 stages"):
        balance([1.0] * 3, 4)


def _step(context: int = 6) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Five decodes (contexts 3..7, their earlier K/V in the cache) and a 6-token prompt."""
    g = torch.Generator().manual_seed(3)
    lens = torch.arange(3, 8)
    tables = torch.arange(10).view(5, 2)
    slots = torch.tensor([int(tables[s, (n - 1) // BLOCK]) * BLOCK + (n - 1) % BLOCK
                          for s, n in enumerate(lens.tolist())] + list(range(40, 40 + context)))
    mask = (torch.arange(2 * BLOCK)[None, :] < lens[:, None])[None, :, None, :]
    span = PrefillSpan(5, context, context, torch.tensor([10, 11]), None, mask_is_causal=True)
    meta = AttentionMetadata(slots, 5, tables, lens, mask, [span])
    ids = torch.randint(0, CONFIG.vocab_size, (5 + context,), generator=g)
    positions = torch.cat([lens - 1, torch.arange(context)])
    return ids, positions, meta


def _cache(model, g_seed: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(g_seed)
    return torch.randn(model.kv_cache_shape(12, BLOCK), generator=g)


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_micro_batches_in_order_compute_the_step(parts):
    model = LlamaForCausalLM(MODEL_CONFIG, _weights(MODEL_CONFIG), (torch.float32,))
    ids, positions, meta = _step()
    expected = model.forward(ids, positions, meta, _cache(model))
    runs = micro_batches(meta, parts)
    assert [r for rows, _ in runs for r in rows] == list(range(11))  # every row once, in order
    assert len(runs) <= parts and all(len(rows) for rows, _ in runs)
    # the prompt stays whole
    assert any(rows.stop == 11 and rows.start <= 5 for rows, _ in runs)
    cache = _cache(model)
    got = torch.cat([model.forward(ids[rows.start:rows.stop], positions[rows.start:rows.stop],
                                   part, cache) for rows, part in runs])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_stages_compute_the_model():
    model = LlamaForCausalLM(MODEL_CONFIG, _weights(MODEL_CONFIG), (torch.float32,))
    ids, positions, meta = _step()
    expected = model.compute_logits(model.forward(ids, positions, meta, _cache(model)))
    first, second = stage_llama(model, range(0, 1), True), stage_llama(model, range(1, 4), False)
    cache = _cache(model)
    h = first.run_layers(first.embed_tokens(ids, torch.float32), positions, meta, cache[:1],
                         torch.float32)
    h = second.final_norm(second.run_layers(h, positions, meta, cache[1:], torch.float32))
    torch.testing.assert_close(first.compute_logits(h), expected, rtol=0, atol=1e-5)
    assert second.params[torch.float32].embed.numel() == 0  # only the root looks tokens up


def test_the_pipeline_over_gloo_gives_the_whole_model():
    # Two stages as two threads of this process, each its own Gloo rank.
    model = LlamaForCausalLM(MODEL_CONFIG, _weights(MODEL_CONFIG), (torch.float32,))
    ids, positions, meta = _step()
    expected = model.compute_logits(model.forward(ids, positions, meta, _cache(model)))
    plan = [range(0, 2), range(2, 4)]

    def run(rank: int, comm) -> torch.Tensor | None:
        stage = PipelineRank(stage_llama(model, plan[rank], rank == 0), rank, 2, comm, 4)
        cache = _cache(model)[plan[rank].start:plan[rank].stop]
        hidden = stage.forward(ids, positions, meta, cache)
        return None if hidden is None else stage.compute_logits(hidden)

    out = run_ranks(2, run)
    assert out[1] is None
    # float32; micro-batches multiply fewer rows at a time than the whole step
    torch.testing.assert_close(out[0], expected, rtol=0, atol=1e-4)


def test_stages_of_tensor_parallel_lanes_over_gloo_give_the_whole_model():
    # pp=2 × tp=2 as the "pp+tp" strategy shards it: four threads, each its own Gloo rank;
    # each stage's two lanes all-reduce in their own subgroup, and the first stage's lanes
    # each compute a slice of the vocabulary's logits, which the root gathers.
    model = LlamaForCausalLM(MODEL_CONFIG, _weights(MODEL_CONFIG), (torch.float32,))
    ids, positions, meta = _step()
    expected = model.compute_logits(model.forward(ids, positions, meta, _cache(model)))
    layout = ParallelLayout(tp=2, pp=2)
    strategy = load_plugins().parallel_strategies.get(layout.strategy)
    plan = [range(0, 1), range(1, 4)]
    lanes = strategy.vocab_ranks(layout)
    widths = [len(split(MODEL_CONFIG.vocab_size, lanes, r)) for r in range(lanes)]
    final: list[torch.Tensor] = []
    got_final = threading.Event()

    def run(rank: int, comm) -> tuple[int, torch.Tensor | None]:
        shard = strategy.shard(model, rank, layout, comm, plan)
        heads = shard.kv_cache_shape(12, BLOCK)[2]
        layers = plan[rank // layout.tp]
        # The whole cache's pages of this rank's layers and KV heads (3 split 2 + 1).
        kv = split(MODEL_CONFIG.num_kv_heads, layout.tp, rank % layout.tp)
        cache = _cache(model)[layers.start:layers.stop, :, kv.start:kv.stop]
        hidden = shard.forward(ids, positions, meta, cache.contiguous())
        if rank >= lanes:
            return heads, None
        if rank == 0:  # the root has the final hidden states; a node sends them to each lane
            final.append(hidden)
            got_final.set()
        assert got_final.wait(30)
        part = shard.compute_logits(final[0])
        return heads, comm.subgroup(range(lanes)).gather_columns(part, widths)

    out = run_ranks(4, run)
    assert [out[r][0] for r in range(4)] == [2, 1, 2, 1]  # each lane its KV heads
    assert [out[r][1] is None for r in range(4)] == [False, True, True, True]
    torch.testing.assert_close(out[0][1], expected, rtol=0, atol=1e-4)
