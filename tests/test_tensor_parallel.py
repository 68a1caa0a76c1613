"""Tensor parallelism: shards that sum to the whole model, the layout and its registry, and
(slow) SmolLM2 over two real processes: the same logits and tokens as one, a worker killed."""

from __future__ import annotations

import threading
from importlib.resources import files
from pathlib import Path

import pytest
import torch

from edgefire.contract.errors import ModelUnavailableError, UnknownComponentError
from edgefire.models.attention import AttentionMetadata, PrefillSpan
from edgefire.models.llama import LlamaConfig, LlamaForCausalLM
from edgefire.models.tensor_parallel import shard_llama, split
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.plugins import load_plugins
from tests.test_fused_decode import _weights

# SmolLM2's head shape (9 query heads over 3 KV heads), small: two ranks split it 2 + 1.
CONFIG = LlamaConfig(vocab_size=250, hidden_size=64, intermediate_size=96, num_layers=2,
                     num_heads=9, num_kv_heads=3, head_dim=16, rope_theta=10000.0,
                     rms_norm_eps=1e-5, max_position=128)
BLOCK = 4


def _prompt_meta(n: int) -> AttentionMetadata:
    table = torch.arange(-(-n // BLOCK))
    return AttentionMetadata(torch.arange(n), 0, torch.zeros(0, 1, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long), torch.zeros(1, 0, 1, 0).bool(),
                             [PrefillSpan(0, n, n, table, None, mask_is_causal=True)])


class ThreadRanks:
    """world_size ranks as threads of this process, summing at a barrier: the shards' math
    without processes."""

    def __init__(self, world_size: int) -> None:
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.parts: list[torch.Tensor | None] = [None] * world_size

    def all_reduce(self, rank: int):
        def reduce(t: torch.Tensor) -> torch.Tensor:
            self.parts[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.parts[1:], self.parts[0])
            self.barrier.wait()
            return t.copy_(total)
        return reduce


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_sum_to_the_whole_model(world_size):
    whole = LlamaForCausalLM(CONFIG, _weights(CONFIG), (torch.float32,))
    ranks = ThreadRanks(world_size)
    shards = [shard_llama(whole, r, world_size, ranks.all_reduce(r)) for r in range(world_size)]
    assert [s.config.num_kv_heads for s in shards] == [len(split(3, world_size, r))
                                                      for r in range(world_size)]
    ids = torch.randint(0, CONFIG.vocab_size, (11,), generator=torch.Generator().manual_seed(2))
    positions, meta = torch.arange(11), _prompt_meta(11)
    blocks = 8
    expected = whole.compute_logits(whole.forward(
        ids, positions, meta, torch.zeros(whole.kv_cache_shape(blocks, BLOCK))))
    results: list[torch.Tensor | None] = [None] * world_size

    def run(rank: int) -> None:
        shard = shards[rank]
        cache = torch.zeros(shard.kv_cache_shape(blocks, BLOCK))
        results[rank] = shard.compute_logits(shard.forward(ids, positions, meta, cache))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each rank computed its vocabulary slice's columns of the same rows.
    assert [r.shape[1] for r in results] == [len(split(250, world_size, r))
                                            for r in range(world_size)]
    # float32: the partial sums meet in another order than one matmul's (the bound)
    torch.testing.assert_close(torch.cat(results, dim=1), expected, rtol=0, atol=1e-4)


def test_split_covers_every_item_once():
    for n in range(1, 12):
        for world in range(1, 5):
            parts = [split(n, world, r) for r in range(world)]
            assert [i for p in parts for i in p] == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_a_model_with_fewer_kv_heads_than_ranks_is_refused():
    whole = LlamaForCausalLM(CONFIG, _weights(CONFIG), (torch.float32,))
    with pytest.raises(ValueError, match="3 KV heads cannot be split over 4 ranks"):
        shard_llama(whole, 0, 4, lambda t: t)


@pytest.mark.parametrize(("raw", "message"), [
    ({"tp": 0}, "tp must be a positive integer"),
    ({"tp": "2"}, "tp must be a positive integer"),
    ({"tp": True}, "tp must be a positive integer"),
    ({"dp": 2}, "must map some of tp, pp, ep"),
    ([2], "must map some of tp, pp, ep"),
])
def test_bad_layouts_are_refused_clearly(raw, message):
    with pytest.raises(ModelUnavailableError, match=message):
        ParallelLayout.parse(raw, "@cf/x")


def test_layouts_name_their_strategy():
    assert ParallelLayout.parse(None).world_size == 1
    assert ParallelLayout.parse({}).strategy == ""
    assert ParallelLayout.parse({"tp": 2}).strategy == "tp"
    layout = ParallelLayout.parse({"tp": 2, "pp": 2})
    assert (layout.strategy, layout.world_size) == ("pp+tp", 4)
    assert {"tp", "pp", "pp+tp", "ep"} <= set(load_plugins().parallel_strategies.names())
    # Expert parallelism combines with no other axis yet: a clear refusal, naming what is.
    combined = ParallelLayout.parse({"ep": 2, "tp": 2}).strategy
    with pytest.raises(UnknownComponentError, match="no parallel strategy named 'ep\\+tp'"):
        load_plugins().parallel_strategies.get(combined)


def test_a_city_sets_layouts_over_the_catalog(tmp_path):
    from edgefire.contract.catalog import Catalog
    from edgefire.contract.cities import load_city
    from edgefire.contract.errors import UnknownModelError
    from edgefire.runtime.node.node import with_layouts

    fra = (Path(str(files("edgefire.edge_nodes"))) / "fra.yaml").read_text()
    (tmp_path / "xyz.yaml").write_text(
        fra + 'parallel: {"@cf/smollm2-135m-instruct": {tp: 2}}\n')
    city = load_city("xyz", tmp_path)
    catalog = with_layouts(Catalog.load(), city.parallel)
    spec = catalog.get("@cf/huggingfacetb/smollm2-135m-instruct")  # named by its alias
    assert ParallelLayout.parse(spec.extra["parallel"]).tp == 2
    assert "parallel" not in catalog.get("@cf/huggingfacetb/smollm2-135m-instruct-int8").extra
    with pytest.raises(UnknownModelError):
        with_layouts(Catalog.load(), {"@cf/nope": {"tp": 2}})
    with pytest.raises(ModelUnavailableError, match="tp must be a positive integer"):
        with_layouts(Catalog.load(), {"@cf/smollm2-135m-instruct": {"tp": 0}})
