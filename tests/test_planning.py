"""The capacity planner: each formula on small configs checked by hand, the real catalog
configs against their publishers' parameter counts, the seeds' figures (Infire: Llama 4 Scout
on 2×H200, Kimi K2.5 on 8×H100), layouts, codecs, and which GPU sets (and cities) host what."""

from __future__ import annotations

import pytest

from edgefire.contract.catalog import Catalog
from edgefire.contract.cities import all_cities
from edgefire.contract.errors import PlanningError
from edgefire.planning import GIB, GpuSet, Layout, PlannedModel, hosting, plan
from edgefire.planning.model import (
    kv_bytes_per_token,
    local_kv_bytes_per_sequence,
    weight_bytes,
)
from edgefire.planning.plan import MIN_HOST_TOKENS, plan_layout, stages
from edgefire.planning.precisions import PRECISIONS, codec
from edgefire.planning.reserve import GPU_RESERVE

CATALOG = Catalog.load()
SCOUT = "@cf/meta/llama-4-scout-17b-16e-instruct"
KIMI = "@cf/moonshotai/kimi-k2.5"

# Small configs whose counts are worked out by hand in each test.
LLAMA = {"num_layers": 2, "hidden_size": 8, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4,
         "intermediate_size": 16, "vocab_size": 10, "weight_dtype": "bf16"}
DSV3 = {"num_layers": 2, "hidden_size": 8, "num_heads": 2, "q_lora_rank": 4, "kv_lora_rank": 4,
        "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2, "intermediate_size": 16,
        "moe_intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "vocab_size": 10,
        "weight_dtype": "bf16"}
LLAMA4 = {**LLAMA, "num_layers": 4, "num_local_experts": 2, "num_experts_per_tok": 1,
          "intermediate_size_mlp": 16, "attention_chunk_size": 16, "no_rope_layer_interval": 4}


def real(model_id: str, codec_name: str | None = None) -> PlannedModel:
    return PlannedModel.real(CATALOG.get(model_id), codec_name)


def small(architecture: str, config: dict, codec_name: str = "identity") -> PlannedModel:
    return PlannedModel("test", architecture, config, codec_name, 8192)


# --- formulas on hand-checked configs -------------------------------------------------------

def test_llama_params_and_gqa_kv():
    m = small("llama", LLAMA)
    # embed 10·8 + lm_head 10·8 + final norm 8 + 2 layers of
    # (q 8·8 + k,v 2·8·4 + o 8·8 = 192) + (3·8·16 = 384) + 2 norms of 8 = 592.
    assert m.shape.params == 80 + 80 + 8 + 2 * 592
    # GQA: 2 (K and V) · layers 2 · kv_heads 1 · head_dim 4 · 2 bytes.
    assert kv_bytes_per_token(m) == 2 * 2 * 1 * 4 * 2 == 32
    assert kv_bytes_per_token(m, "fp32") == 64 and kv_bytes_per_token(m, "fp8") == 16
    tied = small("llama", {**LLAMA, "tie_embeddings": True})
    assert tied.shape.params == m.shape.params - 80
    assert weight_bytes(m) == 2 * m.shape.params  # bf16


def test_deepseek_v3_params_and_mla_kv():
    m = small("deepseek_v3", DSV3)
    # Attention per layer: latent down-projections 8·(4 + 4 + 2) = 80, q_b 4·2·(2+2) = 32,
    # kv_b 4·2·(2+2) = 32, o 2·2·8 = 32: 176; latent norms 4 + 4; norms 2·8.
    attention = 176 + 8 + 16
    dense = attention + 3 * 8 * 16  # layer 0 (first_k_dense_replace 1)
    moe = attention + 4 * 3 * 8 * 4 + 1 * 3 * 8 * 4 + (4 * 8 + 4)  # experts, shared, router
    assert m.shape.params == 80 + 80 + 8 + dense + moe
    # MLA: layers · (kv_lora_rank + qk_rope_head_dim) · bytes = 2 · (4 + 2) · 2.
    assert kv_bytes_per_token(m) == 24


def test_llama4_global_layers_keep_full_kv_and_local_ones_a_chunk():
    m = small("llama4_moe", LLAMA4)
    # Every 4th layer (index 3) is global: one layer of 2·1·4 elements · 2 bytes per token.
    assert kv_bytes_per_token(m) == 16
    # The other three keep at most one chunk of 16 tokens each, per sequence.
    assert local_kv_bytes_per_sequence(m) == 3 * 16 * 16
    assert kv_bytes_per_token(m, all_layers=True) == 4 * 16
    experts = 2 * 3 * 8 * 16 + 3 * 8 * 16 + 2 * 8  # two routed, one shared, the router
    assert m.shape.params == 80 + 80 + 8 + 4 * (192 + experts + 16)


def test_stored_experts_count_experts_that_share_storage_once():
    shared = small("llama4_moe", {**LLAMA4, "stored_experts": 1})
    assert small("llama4_moe", LLAMA4).shape.params - shared.shape.params == 4 * 3 * 8 * 16
    assert small("deepseek_v3", {**DSV3, "stored_experts": 9}).shape.params == \
        small("deepseek_v3", DSV3).shape.params  # never more than there are


def test_bert_counts_the_weights_the_node_loads():
    m = real("@cf/sentence-transformers/all-minilm-l6-v2")
    # all-MiniLM-L6-v2 without its pooler: 22,713,216 − (384·384 + 384).
    assert m.shape.params == 22_713_216 - 147_840
    assert m.encoder and plan(m, GpuSet.parse("1xL4")).tokens is None


def test_precisions_count_their_overheads():
    assert PRECISIONS["int8"].nbytes(1000, rows=10) == 1000 + 10 * 2  # a bf16 scale per row
    assert PRECISIONS["int4-g32"].nbytes(64) == 32 + 2 * 4  # 4 bits, scale and min per 32
    assert PRECISIONS["int4-g32-sym"].nbytes(64) == 32 + 2 * 2  # 4 bits, one scale per 32
    assert PRECISIONS["unweight"].nbytes(1000) == 1500
    assert PRECISIONS["int4-g32-sym"].effective_bits() == pytest.approx(4.5)


def test_codecs_cover_what_the_catalog_says_and_never_grow_a_weight():
    bf16, fp32, int4 = (PRECISIONS[n] for n in ("bf16", "fp32", "int4-g32-sym"))
    assert codec("int8").apply("projections", bf16).name == "int8"
    # both quant codecs hold the embedding table (and a tied lm_head) in INT8 rows
    assert codec("int8").apply("embeddings", bf16).name == "int8"
    assert codec("int4").apply("embeddings", bf16).name == "int8"
    assert codec("identity").apply("embeddings", bf16) is bf16
    assert codec("int8").apply("projections", int4) is int4  # Kimi's experts stay INT4
    assert codec("unweight").apply("embeddings", bf16).name == "unweight"
    assert codec("unweight").apply("projections", fp32) is fp32  # lossless: BF16 only
    base = small("llama", LLAMA)
    for name in ("int8", "int4", "unweight"):
        assert weight_bytes(small("llama", LLAMA, name)) < weight_bytes(base)


# --- the real catalog configs -----------------------------------------------------------

@pytest.mark.parametrize("model_id", [s.id for s in CATALOG.specs
                                      if "params_b" in s.extra.get("config", {})])
def test_formulas_match_the_publishers_parameter_counts(model_id):
    spec = CATALOG.get(model_id)
    # Within 2%: Kimi K2.5's 1.04T includes its vision tower, Scout's 109B too.
    assert real(model_id).shape.params / 1e9 == pytest.approx(
        spec.extra["config"]["params_b"], rel=0.02)


def test_kimi_stores_routed_experts_in_int4_routers_in_fp32_and_the_rest_in_bf16():
    m = real(KIMI)
    experts = 60 * 384 * 3 * 7168 * 2048  # 60 MoE layers of 384 routed experts
    routers = 60 * (384 * 7168 + 384)  # and their routers, with the correction bias
    rest = m.shape.params - experts - routers
    assert weight_bytes(m) == pytest.approx(experts * 4.5 / 8 + routers * 4 + rest * 2,
                                            rel=1e-9)
    assert 550 * GIB < weight_bytes(m) < 560 * GIB  # the seed: "~560 GB"


def test_seed_scout_on_two_h200():
    p = plan(real(SCOUT), GpuSet.parse("2xH200"))
    assert p.fits
    assert p.kv_bytes_per_token == 12 * 2 * 8 * 128 * 2  # only the 12 global layers
    assert p.kv_bytes >= 56 * GIB
    assert p.tokens > 1_200_000


def test_seed_kimi_on_eight_h100():
    p = plan(real(KIMI), GpuSet.parse("8xH100"))
    assert p.fits
    assert p.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert p.kv_bytes >= 30 * GIB


def test_mla_latent_is_whole_on_every_tensor_parallel_rank():
    gpus = GpuSet.parse("8xH100")
    tp = plan_layout(real(KIMI), gpus, Layout(8, 1))
    pp = plan_layout(real(KIMI), gpus, Layout(1, 8))
    assert tp.stages[0].kv_bytes_per_token == 61 * 576 * 2  # replicated, all layers
    assert sum(d.kv_bytes_per_token for d in pp.stages) == 61 * 576 * 2  # split by stage
    scout = plan_layout(real(SCOUT), GpuSet.parse("2xH200"), Layout(2, 1))
    assert scout.stages[0].kv_bytes_per_token == 12 * 2 * 4 * 128 * 2  # GQA: half the heads


def test_a_layout_divides_the_set_and_the_best_is_chosen():
    gpus = GpuSet.parse("8xH100")
    assert Layout.parse("tp4pp2") == Layout.parse("pp2×tp4") == Layout(4, 2)
    best = plan(real(KIMI), gpus)
    for layout in (Layout(8, 1), Layout(4, 2), Layout(2, 4), Layout(1, 8)):
        other = plan(real(KIMI), gpus, layout)
        assert not other.fits or other.tokens <= best.tokens
    with pytest.raises(PlanningError, match="needs 4 devices"):
        plan(real(KIMI), gpus, Layout(4, 1))
    with pytest.raises(PlanningError):
        Layout.parse("tp")


def test_stages_are_contiguous_and_balanced():
    assert stages([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert stages([5, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 6)]
    assert stages([3, 3, 3], 3) == [range(0, 1), range(1, 2), range(2, 3)]


def test_reserve_is_what_reserve_py_states():
    p = plan(real("@cf/meta/llama-3.1-8b-instruct"), GpuSet.parse("1xH100"))
    # runtime + 8192 tokens · (2·4096 + q,k,v 6144 + attn out 4096 + 3·14336) · 2 B
    # + 256 sequences · 128256 logits · 4 B.
    activations = 8192 * (2 * 4096 + 6144 + 4096 + 3 * 14336) * 2
    assert p.reserve_bytes_per_device == GPU_RESERVE.runtime_bytes + activations + \
        256 * 128256 * 4


def test_weights_that_do_not_fit_and_too_little_kv_are_not_hosting():
    # Llama 3.1 8B's 15.0 GiB of weights plus its reserve exceed a T4's 15 GiB.
    t4 = plan(real("@cf/meta/llama-3.1-8b-instruct"), GpuSet.parse("1xT4"))
    assert not t4.fits and t4.reason.startswith("weights need 15.0 GiB per device")
    # The same weights with full multi-head KV (512 KiB a token) and a long context: on an L4
    # the weights fit, but the KV left holds fewer than MIN_HOST_TOKENS tokens.
    spec = CATALOG.get("@cf/meta/llama-3.1-8b-instruct")
    mha = PlannedModel("mha", "llama", {**spec.extra["config"], "num_kv_heads": 32},
                       context_window=131072)
    p = plan(mha, GpuSet.parse("1xL4"))
    assert 0 < p.tokens < MIN_HOST_TOKENS
    assert not p.fits and p.reason == f"KV holds {p.tokens} tokens, fewer than {MIN_HOST_TOKENS}"
    short = PlannedModel("mha", "llama", mha.config, context_window=4096)
    assert plan(short, GpuSet.parse("1xL4")).fits  # one 4096-token context is enough


def test_which_gpu_sets_host_each_big_model():
    assert [str(p.gpus) for p in hosting(real(KIMI))] == ["8×A100", "8×H100", "8×H200"]
    scout = {str(p.gpus) for p in hosting(real(SCOUT))}
    assert "2×H200" in scout and "1×H200" not in scout and "8×L4" not in scout


def test_the_cities_host_what_their_yaml_comments_say():
    sites = {c.code: c.accelerators.gpus for c in all_cities()}
    hosts = {code: {m for m in (KIMI, SCOUT) if plan(real(m), gpus).fits}
             for code, gpus in sites.items()}
    assert hosts == {"fra": {KIMI, SCOUT}, "iad": {SCOUT}, "sin": {SCOUT}, "lhr": set(),
                     "gru": set()}
    small_models = [s.id for s in CATALOG.specs if s.size_tier in ("small", "medium")]
    assert all(plan(real(m), gpus).fits for m in small_models for gpus in sites.values())


@pytest.mark.parametrize(("text", "field"), [
    ("8xB999", "gpus"), ("eight H100", "gpus"), ("0xH100", "gpus"), ("65xH100", "gpus")])
def test_bad_gpu_sets_are_typed_errors(text, field):
    with pytest.raises(PlanningError) as caught:
        GpuSet.parse(text)
    assert caught.value.code == 5006 and caught.value.field == field


def test_unknown_codec_kv_dtype_and_architecture_are_typed_errors():
    with pytest.raises(PlanningError, match="codec"):
        small("llama", LLAMA, "zip")
    with pytest.raises(PlanningError, match="KV dtype"):
        kv_bytes_per_token(small("llama", LLAMA), "int2")
    with pytest.raises(PlanningError, match="no formula"):
        small("mamba", LLAMA)
    with pytest.raises(PlanningError, match="num_heads"):
        small("llama", {**LLAMA, "num_heads": "many"})
    with pytest.raises(PlanningError, match="unknown precision 'int4'") as caught:
        small("deepseek_v3", {**DSV3, "routed_expert_dtype": "int4"})
    assert caught.value.field == "routed_expert_dtype"


def test_expert_parallel_splits_only_the_routed_experts():
    gpus = GpuSet.parse("8xH100")
    assert Layout.parse("ep8") == Layout(1, 1, 8) and str(Layout(1, 1, 8)) == "ep8"
    assert Layout.parse("tp2ep4") == Layout(2, 1, 4) and str(Layout(2, 1, 4)) == "tp2×ep4"
    tp, ep = plan_layout(real(KIMI), gpus, Layout(8, 1)), plan_layout(real(KIMI), gpus,
                                                                     Layout(1, 1, 8))
    whole = plan_layout(real(KIMI), GpuSet.parse("8xH100"), Layout(1, 8)).weight_bytes
    # ep8 holds an eighth of the experts but all of attention and the rest on every device:
    # more per device than tp8, which splits both; its KV is every layer's, as tp8's (MLA)
    assert tp.weight_bytes_per_device < ep.weight_bytes_per_device < whole
    assert ep.stages[0].kv_bytes_per_token == tp.stages[0].kv_bytes_per_token
    assert ep.weight_bytes == ep.weight_bytes_per_device * 8
    with pytest.raises(PlanningError, match="needs 16 devices"):
        plan_layout(real(KIMI), gpus, Layout(2, 1, 8))
