"""Expert parallelism: a DeepSeek-V3 model's experts split over two ranks (threads of this
process, real Gloo all-to-alls) give the whole model's logits; the miniatures over two real
processes (slow) give the single process's logits and tokens, for both MoE architectures."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from edgefire.contract.catalog import Catalog
from edgefire.models.deepseek_v3 import DeepseekV3ForCausalLM
from edgefire.models.expert_parallel import shard_experts
from edgefire.plugins.deepseek_v3 import seeded_weights
from edgefire.runtime.engine.llm_engine import EngineConfig
from edgefire.runtime.loading import build_engine
from edgefire.runtime.parallel.root import ParallelLM
from tests.gloo_ranks import run_ranks
from tests.test_deepseek_v3 import GROUPED, SOFTMAX, prefill
from tests.test_parallel_smollm2 import Recorder, _generate

KIMI = "@cf/moonshotai/kimi-k2.5"
SCOUT = "@cf/meta/llama-4-scout-17b-16e-instruct"


@pytest.mark.parametrize("config", [GROUPED, SOFTMAX], ids=["grouped", "softmax-shared"])
def test_experts_over_two_ranks_give_the_whole_model(config):
    weights = dict(seeded_weights(config, 0))
    ids = list(range(3, 40))  # 37 tokens: the ranks take 19 and 18 of them in each block
    expected = prefill(DeepseekV3ForCausalLM(config, weights, (torch.float32,)), ids)[0]

    def run(rank: int, comm) -> tuple[int, torch.Tensor]:
        model = shard_experts(DeepseekV3ForCausalLM(config, weights, (torch.float32,)), rank,
                              comm)
        held = model.params[torch.float32].layers[-1].mlp.experts.gate_up.shape[0]
        return held, prefill(model, ids)[0]

    results = run_ranks(2, run)
    held = {rank: n for rank, (n, _) in results.items()}
    out = {rank: logits for rank, (_, logits) in results.items()}
    assert held == {0: 4, 1: 4}  # 8 routed experts, 4 a rank
    for rank in (0, 1):  # every rank ends each block with the whole batch's output
        torch.testing.assert_close(out[rank], expected, rtol=0, atol=1e-4)


def test_a_dense_model_is_refused():
    from edgefire.models.llama import LlamaForCausalLM
    from tests.test_tensor_parallel import CONFIG, _weights

    class OneRank:
        rank, world_size = 0, 2

    with pytest.raises(ValueError, match="needs a model with MoE blocks"):
        shard_experts(LlamaForCausalLM(CONFIG, _weights(CONFIG), (torch.float32,)), 0,
                      OneRank())


@pytest.mark.slow
@pytest.mark.parametrize("model_id", [KIMI, SCOUT])
def test_ep2_gives_the_single_process_logits_and_tokens(model_id):
    catalog = Catalog.load()
    spec = catalog.get_runnable(model_id)
    ep2 = replace(spec, id=model_id + "-ep2", aliases=(),
                  extra={**spec.extra, "parallel": {"ep": 2}})
    config = EngineConfig(dtype="float32", kv_cache_bytes=16 << 20, speculative="off")
    single, _ = build_engine(spec, config)
    parallel, _ = build_engine(ep2, config)
    try:
        assert isinstance(parallel.runner.model, ParallelLM)
        # Both ranks keep every layer's KV (attention is replicated), and the budget bounds
        # them together: half the blocks.
        assert parallel.blocks.num_blocks == single.blocks.num_blocks // 2
        assert parallel.kv_pool_bytes <= config.kv_cache_bytes
        prompts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
        single.sampler, parallel.sampler = Recorder(single.sampler), Recorder(parallel.sampler)
        for prompt in prompts:
            assert _generate(parallel, [prompt]) == _generate(single, [prompt])
        worst = max(float((a - b).abs().max()) for a, b in zip(
            parallel.sampler.logits, single.sampler.logits, strict=True))
        assert worst < 1e-4, worst
        alone = [_generate(parallel, [p], 16)[0] for p in prompts]
        assert _generate(parallel, prompts, 16) == alone
    finally:
        parallel.close()
        single.close()
