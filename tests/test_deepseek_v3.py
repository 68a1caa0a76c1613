"""DeepSeek-V3 / Kimi K2.5 (models/deepseek_v3.py, mla.py, moe.py) against references.

Two independent references on the same seeded weights, in float32: HF transformers'
DeepseekV3ForCausalLM (loaded from the very state dict the miniature is built from), and a plain
dense forward written below (MLA with every head's K and V materialized, RoPE as complex
rotations of the interleaved pairs, one token and one expert at a time). Then the real engine
on the served miniature: greedy tokens and per-step logits equal HF's whether requests run
alone or batched, from the prefix cache, in chunks or preempted; the cache holds only the
latent and the RoPE key.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time

import httpx
import pytest
import torch

from edgefire.contract.catalog import Catalog
from edgefire.contract.catalog_api import model_object, openai_model_list
from edgefire.contract.cities import load_city
from edgefire.contract.headers import MINIATURE, WEIGHT_PRECISION
from edgefire.gateway.app import create_app as create_gateway_app
from edgefire.gateway.dashboard.routes import STATIC as DASHBOARD_STATIC
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from edgefire.models.attention import AttentionMetadata, PrefillSpan
from edgefire.models.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM
from edgefire.models.moe import RouterSpec, route
from edgefire.plugins.deepseek_v3 import seeded_weights
from edgefire.plugins.local_paged import create_local_paged_pool
from edgefire.runtime import LLM, EngineConfig, SamplingParams
from edgefire.runtime.engine.llm_engine import LLMEngine
from edgefire.runtime.engine.model_runner import kv_bytes_per_block
from edgefire.runtime.engine.scheduler import ScheduledBatch
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app as create_node_app
from tests.conftest import free_port

transformers = pytest.importorskip("transformers")

KIMI = "@cf/moonshotai/kimi-k2.5"
BLOCK = 16
MAX_NEW = 20
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
TOLERANCE = 1e-4

# Small variants for what the miniature (Kimi: one expert group, sigmoid, YaRN) leaves out:
# group-limited routing with plain RoPE; softmax scoring, no query LoRA, two shared experts.
GROUPED = DeepseekV3Config(
    vocab_size=300, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_layers=3, num_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
    qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=3,
    n_group=4, topk_group=2, routed_scaling_factor=2.5, rms_norm_eps=1e-5)
SOFTMAX = dataclasses.replace(GROUPED, q_lora_rank=None, scoring_func="softmax", n_group=2,
                              topk_group=1, n_shared_experts=2, norm_topk_prob=False,
                              routed_scaling_factor=1.0, first_k_dense_replace=2)

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Shopping list:\n1. apples\n2. bananas\n3. pears\n4. plums\n5. grapes\n6. lemons\n7. figs\n"
    "8. dates\n9. melons\n10. cherries\n11. peaches\n12. apricots\n13.",
]
SYSTEM = ("You are a careful assistant running on a small edge node. Answer in plain English, "
          "keep answers short, say so when you do not know, and show arithmetic when asked "
          "about numbers.")
QUESTIONS = ["What is 7 times 8?", "Name three fruits.", "Who wrote Hamlet?"]


# --------------------------------------------------------------------------- helpers


def miniature_config() -> DeepseekV3Config:
    spec = Catalog.load().get(KIMI)
    return DeepseekV3Config.from_mapping({**spec.extra["config"], **spec.extra["miniature"]})


def hf_model(c: DeepseekV3Config, weights: dict[str, torch.Tensor]):
    rope = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling is not None:
        s = c.rope_scaling
        rope = {"rope_type": "yarn", "rope_theta": c.rope_theta, "factor": s.factor,
                "original_max_position_embeddings": s.original_max_position,
                "beta_fast": s.beta_fast, "beta_slow": s.beta_slow, "mscale": s.mscale,
                "mscale_all_dim": s.mscale_all_dim}
    config = transformers.DeepseekV3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, moe_intermediate_size=c.moe_intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_heads, n_shared_experts=c.n_shared_experts,
        n_routed_experts=c.n_routed_experts, routed_scaling_factor=c.routed_scaling_factor,
        kv_lora_rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank,
        qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
        qk_nope_head_dim=c.qk_nope_head_dim, n_group=c.n_group, topk_group=c.topk_group,
        num_experts_per_tok=c.num_experts_per_tok, first_k_dense_replace=c.first_k_dense_replace,
        norm_topk_prob=c.norm_topk_prob, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=262144, tie_word_embeddings=False, rope_parameters=rope,
        attn_implementation="eager")
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    model.load_state_dict(weights, strict=True)
    return model


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


def prefill(model: DeepseekV3ForCausalLM, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor,
                                                                        torch.Tensor]:
    """Every position's logits of one prompt prefilled alone; also the cache and its slots."""
    n = len(ids)
    table = torch.arange(1, -(-n // BLOCK) + 1)  # block 0 left unused: slots are really mapped
    slots = torch.tensor([int(table[p // BLOCK]) * BLOCK + p % BLOCK for p in range(n)])
    cache = torch.zeros(model.kv_cache_shape(len(table) + 1, BLOCK), dtype=model.kv_dtype)
    empty = torch.zeros(0, 0, dtype=torch.long)
    meta = AttentionMetadata(slots, 0, empty, torch.zeros(0, dtype=torch.long),
                             torch.zeros(1, 0, 1, 0, dtype=torch.bool),
                             [PrefillSpan(0, n, n, table, None)])
    hidden = model.forward(torch.tensor(ids), torch.arange(n), meta, cache)
    return model.compute_logits(hidden), cache, slots


def plain_logits(c: DeepseekV3Config, w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """DeepSeek-V3 written out plainly: no cache, no absorption, no fused weights, loops."""
    assert c.rope_scaling is None  # plain RoPE only; HF checks YaRN
    n, heads, nope, rope, vd = (len(ids), c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
                                c.v_head_dim)

    def norm(x, weight, eps):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def rotate(x):  # [..., n, rope], interleaved pairs as complex numbers
        inv = 1.0 / c.rope_theta ** (torch.arange(0, rope, 2).float() / rope)
        turn = torch.polar(torch.ones(n, rope // 2), torch.outer(torch.arange(n).float(), inv))
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], rope // 2, 2).contiguous())
        return torch.view_as_real(pairs * turn).flatten(-2)

    def swiglu(x, p):
        gate = x @ w[p + "gate_proj.weight"].T
        return (torch.nn.functional.silu(gate) * (x @ w[p + "up_proj.weight"].T)) @ w[
            p + "down_proj.weight"].T

    h = w["model.embed_tokens.weight"][ids]
    for i in range(c.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        x = norm(h, w[p + "input_layernorm.weight"], c.rms_norm_eps)
        if c.q_lora_rank:
            q = norm(x @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], 1e-6)
            q = q @ w[a + "q_b_proj.weight"].T
        else:
            q = x @ w[a + "q_proj.weight"].T
        q = q.view(n, heads, nope + rope).transpose(0, 1)  # [heads, n, qk]
        latent, k_pe = (x @ w[a + "kv_a_proj_with_mqa.weight"].T).split([c.kv_lora_rank, rope], -1)
        latent = norm(latent, w[a + "kv_a_layernorm.weight"], 1e-6)
        kv = (latent @ w[a + "kv_b_proj.weight"].T).view(n, heads, nope + vd).transpose(0, 1)
        k = torch.cat([kv[..., :nope], rotate(k_pe).expand(heads, n, rope)], -1)
        q = torch.cat([q[..., :nope], rotate(q[..., nope:])], -1)
        scores = (q @ k.transpose(1, 2)) * (nope + rope) ** -0.5
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        o = scores.softmax(-1) @ kv[..., nope:]  # [heads, n, v]
        h = h + o.transpose(0, 1).reshape(n, -1) @ w[a + "o_proj.weight"].T
        x = norm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        m = p + "mlp."
        if i < c.first_k_dense_replace:
            h = h + swiglu(x, m)
            continue
        gate_up, down = w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"]
        bias = w[m + "gate.e_score_correction_bias"]
        routed = torch.zeros_like(h)
        for t in range(n):
            logits = x[t] @ w[m + "gate.weight"].T
            score = logits.sigmoid() if c.scoring_func == "sigmoid" else logits.softmax(-1)
            choice = score + bias
            if c.n_group > 1:
                groups = choice.view(c.n_group, -1)
                merit = (groups.topk(2).values.sum(-1) if c.scoring_func == "sigmoid"
                         else groups.max(-1).values)
                allowed = torch.zeros(c.n_group, dtype=torch.bool)
                allowed[merit.topk(c.topk_group).indices] = True
                choice = groups.masked_fill(~allowed[:, None], float("-inf")).flatten()
            chosen = choice.topk(c.num_experts_per_tok).indices
            weight = score[chosen]
            if c.norm_topk_prob:
                weight = weight / weight.sum()
            for e, we in zip(chosen.tolist(), (weight * c.routed_scaling_factor).tolist(),
                             strict=True):
                g, u = (gate_up[e] @ x[t]).chunk(2)
                routed[t] += we * (down[e] @ (torch.nn.functional.silu(g) * u))
        h = h + routed + (swiglu(x, m + "shared_experts.") if c.n_shared_experts else 0)
    return norm(h, w["model.norm.weight"], c.rms_norm_eps) @ w["lm_head.weight"].T


def with_engine(base: LLM, **config) -> LLM:
    """base's model and tokenizer with an engine (and KV pool) of its own."""
    clone = copy.copy(base)
    clone.engine = LLMEngine(base.model, base.tokenizer,
                             EngineConfig(**{"block_size": BLOCK, "dtype": "float32", **config}),
                             base.engine.vocab_size, create_local_paged_pool)
    return clone


def spy_logits(llm: LLM) -> list[torch.Tensor]:
    """Every row of logits the engine samples from, in step order."""
    rows: list[torch.Tensor] = []
    compute = llm.model.compute_logits

    def spy(hidden):
        logits = compute(hidden)
        rows.extend(logits.clone())
        return logits

    llm.model.compute_logits = spy
    return rows


def assert_drained(llm: LLM) -> None:
    blocks = llm.engine.blocks
    assert not llm.engine.has_unfinished()
    assert blocks.num_free_blocks == blocks.num_blocks


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # The miniature's matmuls are tiny: a second torch thread only adds synchronization, and
    # on a loaded machine its spin-waits made this module 20x slower (measured: 42 s vs 1.7 s).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llm() -> LLM:
    """The served miniature, in float32; prefix caching off so parity runs stay independent."""
    return LLM(KIMI, engine_config=EngineConfig(block_size=BLOCK, kv_cache_bytes=16 << 20,
                                                enable_prefix_caching=False, dtype="float32"))


@pytest.fixture(scope="module")
def llm_bf16() -> LLM:
    return LLM(KIMI, engine_config=EngineConfig(block_size=BLOCK, kv_cache_bytes=4 << 20,
                                                dtype="bfloat16"))


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return dict(seeded_weights(miniature_config(), 0))


@pytest.fixture(scope="module")
def hf(weights):
    return hf_model(miniature_config(), weights)


@pytest.fixture(scope="module")
def prompts(llm) -> list[list[int]]:
    chat = llm.tokenizer.chat_template.render([{"role": "user", "content": "What is 2+2?"}])
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    ids.append(llm.tokenizer.encode(chat, add_special_tokens=False))
    assert len({len(p) for p in ids}) == len(ids) and max(map(len, ids)) > 3 * BLOCK
    return ids


@pytest.fixture(scope="module")
def shared_prompts(llm) -> list[list[int]]:
    render = llm.tokenizer.chat_template.render
    ids = [llm.tokenizer.encode(render([{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": q}]),
                                add_special_tokens=False) for q in QUESTIONS]
    common = next(i for i, t in enumerate(zip(*ids, strict=False)) if len(set(t)) > 1)
    assert common >= 2 * BLOCK
    return ids


def greedy_reference(hf, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """HF's greedy continuation (full forward each step, no cache) and its logits rows."""
    seq, rows = list(ids), []
    for _ in range(MAX_NEW):
        logits = hf_logits(hf, seq)[-1]
        rows.append(logits)
        seq.append(int(logits.argmax()))
    return seq[len(ids):], torch.stack(rows)


@pytest.fixture(scope="module")
def reference(hf, prompts) -> list[list[int]]:
    return [greedy_reference(hf, p)[0] for p in prompts]


@pytest.fixture(scope="module")
def shared_reference(hf, shared_prompts) -> list[list[int]]:
    return [greedy_reference(hf, p)[0] for p in shared_prompts]


# --------------------------------------------------------------------------- the forward pass


def test_miniature_prefill_logits_match_hf_transformers(weights, hf, prompts):
    model = DeepseekV3ForCausalLM(miniature_config(), weights, (torch.float32,))
    for ids in prompts:
        ours, _, _ = prefill(model, ids)
        diff = (ours - hf_logits(hf, ids)).abs().max().item()
        assert diff < TOLERANCE, f"{len(ids)} tokens: max |logit diff| {diff}"


@pytest.mark.parametrize("config", [GROUPED, SOFTMAX], ids=["grouped", "softmax"])
def test_variant_logits_match_the_plain_reference(config):
    weights = dict(seeded_weights(config, 7))
    model = DeepseekV3ForCausalLM(config, weights, (torch.float32,))
    ids = torch.randint(0, config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    ours, _, _ = prefill(model, ids.tolist())
    expected = plain_logits(config, weights, ids.tolist())
    assert (ours - expected).abs().max().item() < TOLERANCE
    if config.scoring_func == "sigmoid":  # HF's DeepseekV3 knows only sigmoid routing
        hf_diff = (ours - hf_logits(hf_model(config, weights), ids.tolist())).abs().max()
        assert hf_diff.item() < TOLERANCE


def test_the_plain_reference_is_not_lenient():
    # A reference that agrees with everything proves nothing: one expert's weights changed
    # (an expert tokens really route to) must move its logits far past the tolerance.
    weights = dict(seeded_weights(GROUPED, 7))
    ids = list(range(5, 45))
    model = DeepseekV3ForCausalLM(GROUPED, weights, (torch.float32,))
    ours, _, _ = prefill(model, ids)
    down = weights["model.layers.2.mlp.experts.down_proj"].clone()
    down[3] *= 1.5
    weights["model.layers.2.mlp.experts.down_proj"] = down
    assert (ours - plain_logits(GROUPED, weights, ids)).abs().max().item() > 100 * TOLERANCE


def test_router_bias_chooses_but_does_not_weigh():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])  # makes expert 3 win the choice
    spec = RouterSpec(top_k=2, norm_topk_prob=True, scaling=2.0)
    routing = route(logits, spec, bias)
    assert sorted(routing.experts[0].tolist()) == [0, 3]
    scores = logits.sigmoid()[0, [0, 3]]
    expected = dict(zip([0, 3], (2.0 * scores / scores.sum()).tolist(), strict=True))
    for e, w in zip(routing.experts[0].tolist(), routing.weights[0].tolist(), strict=True):
        assert w == pytest.approx(expected[e])
    # Group-limited: with 2 groups of 2 and topk_group 1, both experts come from one group.
    grouped = route(torch.tensor([[3.0, -3.0, 2.0, 2.0]]), RouterSpec(top_k=2, n_group=2))
    assert sorted(grouped.experts[0].tolist()) == [2, 3]


def test_seeded_weights_are_deterministic():
    first, again = dict(seeded_weights(GROUPED, 1)), dict(seeded_weights(GROUPED, 1))
    other = dict(seeded_weights(GROUPED, 2))
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["lm_head.weight"], other["lm_head.weight"])


# --------------------------------------------------------------------------- the KV cache


def test_the_cache_holds_only_the_latent_and_the_rope_key(weights, hf, prompts):
    c = miniature_config()
    model = DeepseekV3ForCausalLM(c, weights, (torch.float32,))
    width = c.kv_lora_rank + c.qk_rope_head_dim
    assert model.kv_cache_shape(10, BLOCK) == (c.num_layers, 10, BLOCK, width)
    ids = prompts[-1]
    _, cache, slots = prefill(model, ids)
    with torch.inference_mode():
        hf_cache = hf(torch.tensor([ids]), use_cache=True).cache
    for i in range(c.num_layers):
        rows = cache[i].view(-1, width)[slots]
        # HF caches the same two things per token: the normed latent and the rotated key.
        expected = torch.cat([hf_cache.layers[i].keys[0, 0], hf_cache.layers[i].values[0, 0]],
                             dim=-1)
        assert (rows - expected).abs().max().item() < 1e-5
    # Nothing was written outside the prompt's slots.
    written = cache.view(c.num_layers, -1, width).abs().sum(-1) != 0
    assert written.sum(-1).tolist() == [len(ids)] * c.num_layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_bytes_per_token_are_the_latent_and_rope_key(llm, llm_bf16, dtype):
    served = llm if dtype == torch.float32 else llm_bf16
    c, engine = served.model.config, served.engine
    pool = engine.runner.kv_cache
    assert pool.dtype == dtype
    planned = c.num_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * dtype.itemsize
    measured = pool.nbytes / (engine.blocks.num_blocks * BLOCK)
    assert measured == planned == kv_bytes_per_block(served.model, BLOCK) / BLOCK
    assert planned == 4 * (64 + 16) * dtype.itemsize
    # A full multi-head cache of the same model: 8 heads x (48 + 32) per layer, 8 times more.
    assert planned * 8 == c.num_layers * c.num_heads * (48 + 32) * dtype.itemsize


# --------------------------------------------------------------------------- through the engine


def test_greedy_decode_matches_hf_token_for_token_and_logit_for_logit(llm, hf, prompts):
    fresh = with_engine(llm, kv_cache_bytes=16 << 20, enable_prefix_caching=False)
    rows = spy_logits(fresh)
    for ids in prompts:
        rows.clear()
        [result] = fresh.generate([ids], GREEDY)
        expected, expected_rows = greedy_reference(hf, ids)
        assert result.token_ids == expected
        # Row 0 comes from the prefill, the rest from absorbed-MLA decode steps.
        diff = (torch.stack(rows) - expected_rows).abs().max().item()
        assert diff < TOLERANCE, f"{len(ids)}-token prompt: max |logit diff| {diff}"
    assert_drained(fresh)


def test_batched_equals_alone(llm, prompts, reference):
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    together = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    assert alone == together == reference
    assert_drained(llm)


def test_a_prefix_cache_hit_equals_a_miss(llm, shared_prompts, shared_reference):
    cached = with_engine(llm, kv_cache_bytes=16 << 20, enable_prefix_caching=True)
    first = cached.generate([shared_prompts[0]], GREEDY)[0]
    assert first.usage.cached_tokens == 0 and first.token_ids == shared_reference[0]
    results = cached.generate(shared_prompts, GREEDY)
    assert [r.token_ids for r in results] == shared_reference
    assert all(r.usage.cached_tokens >= 2 * BLOCK for r in results)
    assert_drained(cached)


def test_chunked_prefill_equals_unchunked(llm, prompts, reference):
    budget = 16
    chunked = with_engine(llm, kv_cache_bytes=16 << 20, max_num_batched_tokens=budget,
                          enable_prefix_caching=False)
    steps: list[list[tuple[int, int, int]]] = []
    schedule = chunked.engine.scheduler.schedule

    def spy() -> ScheduledBatch:
        batch = schedule()
        steps.append([(n, s.num_computed_tokens, s.num_tokens)
                      for s, n in zip(batch.seqs, batch.num_scheduled_tokens, strict=True)])
        return batch

    chunked.engine.scheduler.schedule = spy
    results = chunked.generate(prompts, GREEDY)
    assert [r.token_ids for r in results] == reference
    # Prompts really were split, and a later chunk attended to the earlier ones' latents.
    assert any(n > 1 and done > 0 for step in steps for n, done, _ in step)
    assert any(n > 1 and done + n < known for step in steps for n, done, known in step)
    assert_drained(chunked)


def test_preemption_recomputes_identically(llm, prompts, reference):
    per_block = kv_bytes_per_block(llm.model, BLOCK)
    need = max(-(-(len(p) + MAX_NEW) // BLOCK) for p in prompts)
    tight = with_engine(llm, kv_cache_bytes=(need + 2) * per_block, enable_prefix_caching=False)
    results = tight.generate(prompts, GREEDY)
    assert tight.engine.stats().num_preemptions > 0
    assert [r.token_ids for r in results] == reference
    assert_drained(tight)


def test_bfloat16_is_float32_up_to_rounding(llm_bf16, weights, prompts):
    # The node's default (auto) computes and caches in bfloat16 here. Rounding moves logits by
    # a few hundredths, and where it flips a near-tied expert choice by up to about 2 at that
    # token; a broken bfloat16 path (cache, RoPE, absorbed decode) moves every position.
    config = miniature_config()
    wide = DeepseekV3ForCausalLM(config, weights, (torch.float32,))
    narrow = DeepseekV3ForCausalLM(config, weights, (torch.bfloat16,))
    ids = prompts[2]
    per_position = (prefill(wide, ids)[0] - prefill(narrow, ids)[0]).abs().amax(-1)
    assert per_position.median().item() < 0.3
    results = llm_bf16.generate(prompts, GREEDY)
    assert all(len(r.token_ids) == MAX_NEW for r in results)
    assert_drained(llm_bf16)


# --------------------------------------------------------------------------- the catalog


def test_the_catalog_says_it_is_a_miniature_and_keeps_the_real_config():
    spec = Catalog.load().get("@cf/kimi-k2.5")
    assert spec.id == KIMI and spec.runnable and spec.weights == "miniature://seed"
    real = spec.extra["config"]
    assert (real["num_layers"], real["n_routed_experts"], real["kv_lora_rank"]) == (61, 384, 512)
    note = spec.miniature
    assert note.startswith("miniature: num_layers 4 of 61, hidden_size 256 of 7168")
    assert "n_routed_experts 16 of 384" in note and "seeded at random" in note
    assert note.isascii()  # it travels as a header value
    listed = {p["property_id"]: p["value"]
              for p in model_object(spec, lambda _: None)["properties"]}
    assert listed["miniature"] == note and "planning_only" not in listed
    models = {m["id"]: m for m in openai_model_list(Catalog.load())["data"]}
    assert models[KIMI]["miniature"] == note
    assert "miniature" not in models["@cf/huggingfacetb/smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def live_node(serve):
    """A real node (Frankfurt) over HTTP; it heartbeats to a gateway URL that may not listen."""
    gateway_port, node_port = free_port(), free_port()
    node = EdgeNode(load_city("fra"), NodeSettings(
        kv_cache_mib=16, gateway_url=f"http://127.0.0.1:{gateway_port}",
        public_url=f"http://127.0.0.1:{node_port}", heartbeat_interval_s=0.2))
    with serve(create_node_app(node), node_port) as node_url:
        yield node_url, gateway_port


ASK = {"prompt": "Tell me about Paris.", "max_tokens": 6, "temperature": 0}


@pytest.mark.slow
def test_the_node_answers_the_alias_saying_it_is_a_miniature(live_node):
    note = Catalog.load().get(KIMI).miniature
    with httpx.Client(base_url=live_node[0], timeout=120) as direct:
        answer = direct.post("/client/v4/accounts/acct/ai/run/@cf/kimi-k2.5", json=ASK)
        assert answer.status_code == 200, answer.text
        assert answer.headers[MINIATURE] == note
        assert answer.headers[WEIGHT_PRECISION]
        result = answer.json()["result"]
        assert isinstance(result["response"], str) and result["usage"]["completion_tokens"] > 0

        streamed = direct.post("/client/v4/accounts/acct/ai/run/@cf/kimi-k2.5",
                               json={**ASK, "stream": True})
        assert streamed.status_code == 200 and streamed.headers[MINIATURE] == note
        assert streamed.text.rstrip().endswith("data: [DONE]")

        chat = direct.post("/client/v4/accounts/acct/ai/v1/chat/completions", json={
            "model": "@cf/kimi-k2.5", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200 and chat.headers[MINIATURE] == note
        assert chat.json()["choices"][0]["message"]["role"] == "assistant"

        found = direct.get("/client/v4/accounts/acct/ai/models/search",
                           params={"search": "kimi"}).json()["result"]
        [shown] = [m for m in found if m["name"] == KIMI]
        assert {"property_id": "miniature", "value": note} in shown["properties"]
        listed = direct.get("/client/v4/accounts/acct/ai/v1/models").json()["data"]
        assert [m["miniature"] for m in listed if m["id"] == KIMI] == [note]


@pytest.mark.slow
@pytest.mark.skipif(not DASHBOARD_STATIC.is_dir(),
                    reason="the gateway cannot start here: no dashboard static folder")
def test_the_gateway_relays_the_miniature_header(live_node, serve):
    node_url, gateway_port = live_node
    state = GatewayState.build(GatewaySettings(redis_url=None), db=Database(":memory:"))
    account = state.accounts.create_account("a").id
    _, token = state.accounts.create_token(account)
    with serve(create_gateway_app(state), gateway_port) as gateway_url, \
            httpx.Client(base_url=gateway_url, timeout=120,
                         headers={"authorization": f"Bearer {token}"}) as through:
        deadline = time.monotonic() + 30
        while not state.directory.healthy():
            assert time.monotonic() < deadline, "the node did not register"
            time.sleep(0.05)
        relayed = through.post(f"/client/v4/accounts/{account}/ai/run/@cf/kimi-k2.5", json=ASK)
        assert relayed.status_code == 200, relayed.text
        assert relayed.headers[MINIATURE] == Catalog.load().get(KIMI).miniature
        direct = httpx.post(f"{node_url}/client/v4/accounts/acct/ai/run/@cf/kimi-k2.5",
                            json=ASK, timeout=120)
        assert json.loads(relayed.text)["result"]["response"] == direct.json()["result"][
            "response"]
