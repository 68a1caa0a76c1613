"""The benches' llama.cpp peers: GGUF variant rewrites, best-of-variants ratios, serve ratios."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType

from bench.engine import decode_flop_per_token, full_batch_rate
from bench.engine_report import TARGETS, compute_ratios
from bench.gguf_variants import SHIPPED, bf16_max_error, ensure_variants
from bench.peers import best_of
from bench.serve import best_peer, versus
from bench.serve_peer import RequestTrace, llama_bodies, summarise
from edgefire.models.llama import LlamaConfig

TOKENS = ["<unk>", "<s>", "</s>", "hello", "world"]


def _tiny_gguf(path: Path) -> Path:
    """A Q4_1 model in miniature: a Q4_1 and a Q8_0 matrix, an F32 norm, tokenizer arrays."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_1))
    writer.add_uint32("llama.block_count", 1)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_array("tokenizer.ggml.tokens", TOKENS)
    writer.add_array("tokenizer.ggml.token_type", [3, 3, 3, 1, 1])
    writer.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m }}{% endfor %}")
    weight = rng.standard_normal((8, 64), dtype=np.float32)
    writer.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(weight, QType.Q4_1),
                      raw_dtype=QType.Q4_1)
    writer.add_tensor("token_embd.weight", gguf.quants.quantize(weight * 2, QType.Q8_0),
                      raw_dtype=QType.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _values(path: Path) -> dict:
    return {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}


def test_variants_copy_metadata_and_reencode_weights(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFIRE_PEERS", str(tmp_path / "peers"))
    source = _tiny_gguf(tmp_path / "tiny.Q4_1.gguf")
    paths = ensure_variants(source, [SHIPPED, "q8_0", "bf16"])
    assert paths[SHIPPED] == source
    assert all(p.parent == tmp_path / "peers" / "gguf" for n, p in paths.items() if n != SHIPPED)
    before = _values(source)
    for name, file_type in (("q8_0", gguf.LlamaFileType.MOSTLY_Q8_0),
                            ("bf16", gguf.LlamaFileType.MOSTLY_BF16)):
        after = _values(paths[name])
        assert after.pop("general.file_type") == file_type
        assert after == {k: v for k, v in before.items() if k != "general.file_type"}
        types = {t.name: QType(t.tensor_type) for t in gguf.GGUFReader(paths[name]).tensors}
        matrix = QType.Q8_0 if name == "q8_0" else QType.BF16
        assert types == {"blk.0.ffn_up.weight": matrix, "token_embd.weight": matrix,
                         "blk.0.attn_norm.weight": QType.F32}
    assert bf16_max_error(source, paths["bf16"]) == 0.0
    src = {t.name: t for t in gguf.GGUFReader(source).tensors}
    q8 = {t.name: t for t in gguf.GGUFReader(paths["q8_0"]).tensors}
    # Already Q8_0: copied bit for bit; Q4_1: re-encoded within Q8_0's step.
    assert np.array_equal(q8["token_embd.weight"].data, src["token_embd.weight"].data)
    want = gguf.quants.dequantize(src["blk.0.ffn_up.weight"].data, QType.Q4_1)
    got = gguf.quants.dequantize(q8["blk.0.ffn_up.weight"].data, QType.Q8_0)
    assert np.abs(got - want).max() <= np.abs(want).max() / 127
    # A second call reuses the cached files.
    stamp = paths["bf16"].stat().st_mtime_ns
    assert ensure_variants(source, ["bf16"])["bf16"].stat().st_mtime_ns == stamp


def test_bf16_check_catches_a_wrong_rounding(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFIRE_PEERS", str(tmp_path / "peers"))
    source = _tiny_gguf(tmp_path / "tiny.Q4_1.gguf")
    bf16 = ensure_variants(source, ["bf16"])["bf16"]
    reader = gguf.GGUFReader(bf16, "r+")  # memory-mapped for writing
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    tensor.data.view(np.uint16)[0, 0] ^= 1  # one bf16 ulp off
    reader.data.flush()
    assert bf16_max_error(source, bf16) > 0


def test_unknown_variant_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="q2_k"):
        ensure_variants(tmp_path / "x.gguf", ["q2_k"])


def _variant(single_tg: float, c32_out: float, c32_tg: float, c32_pp: float) -> dict:
    return {"available": True,
            "single": {"decode_tok_s": single_tg, "prefill_tok_s": 10 * single_tg},
            "batched": {"1": {"output_tok_s": single_tg, "decode_tok_s": single_tg,
                              "prefill_tok_s": 10 * single_tg},
                        "32": {"output_tok_s": c32_out, "decode_tok_s": c32_tg,
                               "prefill_tok_s": c32_pp}}}


def _llama() -> dict:
    variants = {"q4_1": _variant(60.0, 300.0, 420.0, 900.0),
                "q8_0": _variant(75.0, 320.0, 400.0, 1200.0),
                "bf16": _variant(50.0, 280.0, 380.0, 1500.0)}
    return {"available": True, "variants": variants, "best": best_of(variants)}


def test_best_of_takes_each_metrics_fastest_variant() -> None:
    best = _llama()["best"]
    assert best["single"]["decode_tok_s"] == {"value": 75.0, "variant": "q8_0"}
    assert best["batched"]["32"]["output_tok_s"] == {"value": 320.0, "variant": "q8_0"}
    assert best["batched"]["32"]["decode_tok_s"] == {"value": 420.0, "variant": "q4_1"}
    assert best["batched"]["32"]["prefill_tok_s"] == {"value": 1500.0, "variant": "bf16"}
    assert list(best["batched"]) == ["1", "32"]
    assert best_of({})["single"]["decode_tok_s"] == {"value": None, "variant": None}


def test_ratios_are_against_the_best_variant_and_name_it() -> None:
    ef = {"1": {"per_request_decode_tok_s": 90.0, "prefill_tok_s": 700.0},
          "32": {"output_tok_s": 640.0, "decode_tok_s": 840.0, "prefill_tok_s": 2100.0}}
    result = {"edgefire": {"per_concurrency": ef}, "hf": {"available": False},
              "llama_cpp": _llama()}
    ratios, targets = compute_ratios(result, 32)
    assert ratios["single_decode_vs_llama_cpp"] == 1.2
    assert ratios["batch_vs_llama_cpp"] == 2.0
    assert ratios["batch_decode_vs_llama_cpp"] == 2.0
    assert ratios["prefill_vs_llama_cpp"] == 1.4
    assert ratios["batch_vs_hf"] is None
    assert ratios["vs_llama_cpp"]["prefill_vs_llama_cpp"] == {
        "edgefire": 2100.0, "llama_cpp": 1500.0, "llama_cpp_variant": "bf16"}
    assert set(targets) == set(TARGETS)
    assert targets["prefill_vs_llama_cpp"] == {"target": 1.5, "ratio": 1.4, "met": False,
                                               "llama_cpp_variant": "bf16"}
    assert targets["batch_decode_vs_llama_cpp"]["llama_cpp_variant"] == "q4_1"
    assert targets["single_decode_vs_llama_cpp"]["met"] is True
    # No quantized run: their targets stay, without a ratio.
    assert targets["single_decode_int8_vs_llama_cpp"]["ratio"] is None


def test_llama_server_gets_the_nodes_prompt_and_token_count() -> None:
    payloads = [{"prompt": "a", "max_tokens": 40, "temperature": 0.7, "seed": 5},
                {"prompt": "b", "max_tokens": 50, "temperature": 0.7, "seed": 6}]
    done = RequestTrace(sent=0.0, completion_tokens=31, ok=True)
    failed = RequestTrace(sent=0.0)
    bodies = llama_bodies(payloads, [[1, 2], [3]], [done, failed])
    assert [b["prompt"] for b in bodies] == [[1, 2], [3]]
    assert [b["n_predict"] for b in bodies] == [31, 50]  # the node's count, else max_tokens
    assert all(b["ignore_eos"] and b["stream"] for b in bodies)
    assert [b["seed"] for b in bodies] == [5, 6]


def test_serve_ratios_per_client_count() -> None:
    ours = summarise(4, [RequestTrace(0.0, [0.5, 0.6, 0.7], 3, True)], 1.0, 1.0)
    theirs = summarise(4, [RequestTrace(0.0, [0.25, 0.45, 0.65], 3, True)], 2.0, 1.5)
    vs = versus([ours], {"levels": [theirs]})
    assert vs["4"]["output_tok_s"] == 2.0
    assert vs["4"]["itl_p99_ms"] == 0.5
    assert vs["4"]["ttft_p99_ms"] == 2.0
    assert vs["4"]["output_tokens"] == [3, 3]
    assert versus([ours], {"available": False}) == {}


def test_serve_ratios_take_the_best_llama_server_variant_per_client_count() -> None:
    def level(clients: int, tok_s: float) -> dict:
        return {"clients": clients, "output_tok_s": tok_s}

    peers = {"q8_0": {"variant": "q8_0", "levels": [level(1, 60.0), level(16, 150.0)]},
             "bf16": {"variant": "bf16", "levels": [level(1, 50.0), level(16, 170.0)]},
             "q4_1": {"available": False, "note": "llama-server failed"}}
    best = best_peer(peers)
    assert [(lv["variant"], lv["output_tok_s"]) for lv in best["levels"]] == [
        ("q8_0", 60.0), ("bf16", 170.0)]
    assert best_peer({"q8_0": {"available": False}})["available"] is False


def test_bf16_reference_rounds_to_nearest_even() -> None:
    # The check's reference is torch's rounding; pin it, since the check relies on it.
    x = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8], dtype=torch.float32)
    assert x.to(torch.bfloat16).float().tolist() == [1.0, 1.0 + 2**-6]


def test_c64_decode_is_set_against_the_gemm_roofline() -> None:
    ef = {"64": {"decode_tok_s": 1000.0}}
    result = {"edgefire": {"per_concurrency": ef, "decode_flop_per_token": 268_959_744},
              "hf": {"available": False}, "llama_cpp": _llama(),
              "roofline": {"gemm_tflop_s": 0.4}}
    ratios, targets = compute_ratios(result, 32)
    assert ratios["c64_decode_of_gemm_roofline"] == 0.672  # 1000 × 0.269 GFLOP / 0.4 TFLOP/s
    assert targets["c64_decode_of_gemm_roofline"] == {
        "target": 0.5, "ratio": 0.672, "met": True, "llama_cpp_variant": None}
    # Without a C=64 run (or a dense model's FLOPs), the target stays without a figure.
    del result["edgefire"]["per_concurrency"]["64"]
    assert compute_ratios(result, 32)[1]["c64_decode_of_gemm_roofline"]["ratio"] is None


def test_lockstep_decode_is_set_against_the_roofline_and_llama_cpps_s_tg() -> None:
    ef = {"64": {"decode_tok_s": 500.0}}
    lockstep = {"32": {"decode_tok_s": 840.0}, "64": {"decode_tok_s": 1000.0}}
    result = {"edgefire": {"per_concurrency": ef, "decode_flop_per_token": 268_959_744,
                           "lockstep": lockstep},
              "hf": {"available": False}, "llama_cpp": _llama(),
              "roofline": {"gemm_tflop_s": 0.4}}
    ratios, targets = compute_ratios(result, 32)
    assert ratios["c64_decode_of_gemm_roofline"] == 0.336  # the thinning batch's rate
    assert targets["c64_lockstep_decode_of_gemm_roofline"] == {
        "target": 0.5, "ratio": 0.672, "met": True, "llama_cpp_variant": None}
    assert ratios["batch_decode_lockstep_vs_llama_cpp"] == 2.0  # 840 vs q4_1's S_TG 420
    assert "batch_decode_lockstep_vs_llama_cpp" not in targets
    del result["edgefire"]["lockstep"]
    assert compute_ratios(result, 32)[0]["c64_lockstep_decode_of_gemm_roofline"] is None


def test_full_batch_rate_counts_only_the_steps_every_sequence_decodes() -> None:
    # b starts last (t=2) and a ends first (t=5): tokens in (2, 5] are a's 3, 4, 5 and b's 3, 4.
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 6.0, 7.0]
    assert full_batch_rate([a, b]) == (3.0, round(5 / 3.0, 2))
    assert full_batch_rate([[1.0], [2.0]]) == (0.0, None)  # no step holds both


def test_c64_memory_floor_reads_the_weights_and_each_sequences_kv_once() -> None:
    # 64 sequences, prompts of 300 tokens, 127 new: a step's mean context is 364 tokens each.
    ef = {"64": {"decode_tok_s": 1000.0, "requests": 64, "prompt_tokens": 64 * 300}}
    result = {"edgefire": {"per_concurrency": ef, "decode_flop_per_token": 268_959_744,
                           "weight_bytes": 269_030_016},
              "hf": {"available": False}, "llama_cpp": _llama(),
              "kv_bytes_per_token": {"measured": 23_040.0},
              "workload": {"max_new_tokens": 127},
              "roofline": {"gemm_tflop_s": 2.0, "read_gb_s": 30.0}}
    ratios, targets = compute_ratios(result, 32)
    step_bytes = 269_030_016 + 23_040 * 64 * 364  # 805.7 MB: 2,383 tok/s at 30 GB/s
    floor = 64 * 30e9 / step_bytes * 268_959_744 / 2e12
    assert ratios["c64_memory_floor_of_gemm_roofline"] == round(floor, 3) == 0.32
    assert "c64_memory_floor_of_gemm_roofline" not in targets  # a bound, not a target
    del result["roofline"]["read_gb_s"]
    assert compute_ratios(result, 32)[0]["c64_memory_floor_of_gemm_roofline"] is None


def test_decode_flops_per_token_count_every_matmul_of_smollm2() -> None:
    # SmolLM2-135M: 30 layers of hidden 576, 9 heads and 3 KV heads of 64, MLP 1536, and the
    # tied 49,152-token LM head: 134,479,872 multiply-adds a token.
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                         rope_theta=1e5, rms_norm_eps=1e-5, max_position=8192)
    assert decode_flop_per_token(SimpleNamespace(model=SimpleNamespace(config=config))) == (
        2 * 134_479_872)
    assert decode_flop_per_token(SimpleNamespace(model=SimpleNamespace())) is None


def test_quantized_single_streams_are_against_the_same_best_figure() -> None:
    ef = {"1": {"per_request_decode_tok_s": 90.0}}
    quantized = {"int4": {"per_request_decode_tok_s": 120.0,
                          "without_speculation": {"per_request_decode_tok_s": 105.0}}}
    result = {"edgefire": {"per_concurrency": ef, "quantized": quantized},
              "hf": {"available": False}, "llama_cpp": _llama()}
    ratios, targets = compute_ratios(result, 32)
    assert ratios["single_decode_int4_vs_llama_cpp"] == 1.6  # 120 / q8_0's 75
    assert ratios["single_decode_int4_no_drafts_vs_llama_cpp"] == 1.4
    assert targets["single_decode_int4_vs_llama_cpp"] == {
        "target": 1.5, "ratio": 1.6, "met": True, "llama_cpp_variant": "q8_0"}


def test_quantized_batches_are_against_the_best_and_the_nearest_precision() -> None:
    ef = {"1": {"per_request_decode_tok_s": 90.0}}
    quantized = {
        "int8": {"per_request_decode_tok_s": 120.0,
                 "without_speculation": {"per_request_decode_tok_s": 105.0},
                 "batch": {"concurrency": 32, "output_tok_s": 480.0, "decode_tok_s": 840.0}},
        # a run at another concurrency than the reference gives no batched ratio
        "int4": {"per_request_decode_tok_s": 120.0,
                 "without_speculation": {"per_request_decode_tok_s": 105.0},
                 "batch": {"concurrency": 8, "output_tok_s": 1.0, "decode_tok_s": 1.0}}}
    result = {"edgefire": {"per_concurrency": ef, "quantized": quantized},
              "hf": {"available": False}, "llama_cpp": _llama()}
    ratios, targets = compute_ratios(result, 32)
    assert ratios["batch_int8_vs_llama_cpp"] == 1.5  # 480 / q8_0's 320, the best
    assert ratios["batch_decode_int8_vs_llama_cpp"] == 2.0  # 840 / q4_1's 420
    assert ratios["batch_decode_int8_vs_q8_0"] == 2.1  # 840 / q8_0's 400
    assert ratios["vs_llama_cpp"]["batch_decode_int8_vs_q8_0"]["llama_cpp_variant"] == "q8_0"
    assert not any(name.startswith("batch") and "int4" in name for name in ratios)
    assert set(targets) == set(TARGETS)  # no targets of their own


def test_a_tagged_run_writes_beside_the_untagged_one(tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    from bench._common import write_results

    monkeypatch.setenv("EDGEFIRE_BENCH_RESULTS", str(tmp_path))
    monkeypatch.delenv("EDGEFIRE_BENCH_TAG", raising=False)
    write_results("engine", {"roofline": {}, "run": 1}, "plain")
    monkeypatch.setenv("EDGEFIRE_BENCH_TAG", "avx2")
    assert write_results("engine", {"roofline": {}, "run": 2}, "tagged").name == "engine-avx2.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "engine-avx2.json", "engine-avx2.md", "engine.json", "engine.md"]
    assert '"run": 1' in (tmp_path / "engine.json").read_text()
    capsys.readouterr()
