"""The engine bench's ratios, targets and tables (bench/engine.py runs it).

llama.cpp runs on several GGUF variants (bench/peers.py); every ratio against it takes its best
variant for that metric (`result["llama_cpp"]["best"]`) and names the variant it was.
"""

from __future__ import annotations

from bench._common import markdown_table, ratio

# Each against llama.cpp's best variant for that metric; the batched ones at the reference
# concurrency (32): output tok/s incl. prefill, decode only (S_TG), prefill only (S_PP).
# Single-stream decode is edgefire on its lossless (dense) weights against llama.cpp's best
# (llama-bench tg, which has no speculative decoding), with the engine's default n-gram drafts;
# single_decode_no_drafts_vs_llama_cpp is the same stream with them off.
# The quantized variants (INT8, INT4) are timed single stream in the same run against the same
# llama.cpp figure: single_decode_<variant>_vs_llama_cpp, with drafts and without.
# They also run the reference concurrency's workload (no target): batch_<variant>_vs_llama_cpp
# and batch_decode_<variant>_vs_llama_cpp against llama.cpp's best, and the same against the
# variant of the nearest precision (EQUAL_PRECISION: INT8 per row against Q8_0's per 32
# values, INT4 in groups of 32 against Q4_1's), _vs_<variant>.
# c64_decode_of_gemm_roofline is not a ratio against a peer: C=64's decode rate times the
# model's matmul FLOPs per token, as a fraction of the BF16 GEMM throughput measured beside it.
# Beside it (no target), c64_memory_floor_of_gemm_roofline: the most that fraction could be if
# C=64's decode steps only had to read memory (_memory_floor_fraction). C=64's decode rate spans
# a batch that thins out as requests of other lengths finish; c64_lockstep_decode_of_gemm_roofline
# takes the rate with every sequence decoding in every step (bench/engine.py's run_lockstep, the
# shape of llama-batched-bench's S_TG), as does batch_decode_lockstep_vs_llama_cpp (no target)
# at the reference concurrency against llama.cpp's S_TG.
TARGETS = {"single_decode_vs_llama_cpp": 1.0, "single_decode_int8_vs_llama_cpp": 1.5,
           "single_decode_int4_vs_llama_cpp": 1.5, "batch_vs_llama_cpp": 2.0,
           "batch_decode_vs_llama_cpp": 1.5, "prefill_vs_llama_cpp": 1.5,
           "c64_decode_of_gemm_roofline": 0.5, "c64_lockstep_decode_of_gemm_roofline": 0.5}
EQUAL_PRECISION = {"int8": "q8_0", "int4": "q4_1"}


def _get(d: dict | None, *keys: str) -> float | None:
    for key in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d  # type: ignore[return-value]


def _best(ll: dict, *keys: str) -> tuple[float | None, str | None]:
    """llama.cpp's best value for a metric over its variants, and the variant that gave it."""
    entry = _get(ll, "best", *keys)
    return (entry["value"], entry["variant"]) if isinstance(entry, dict) else (None, None)


def _variant(ll: dict, variant: str, *keys: str) -> tuple[float | None, str | None]:
    """One llama.cpp variant's value for a metric, named as _best names its variant."""
    value = _get(ll, "variants", variant, *keys)
    return (value, variant) if value is not None else (None, None)


def _quantized_batch(result: dict, ll: dict, ref: str) -> dict:
    """The quantized variants' batched ratios (the comment above TARGETS says which)."""
    pairs = {}
    for variant, q in result["edgefire"].get("quantized", {}).items():
        if _get(q, "batch", "concurrency") != int(ref):
            continue
        peer = EQUAL_PRECISION.get(variant)
        for metric, name in (("output_tok_s", "batch"), ("decode_tok_s", "batch_decode")):
            ours = _get(q, "batch", metric)
            pairs[f"{name}_{variant}_vs_llama_cpp"] = (ours, _best(ll, "batched", ref, metric))
            if peer is not None:
                pairs[f"{name}_{variant}_vs_{peer}"] = (
                    ours, _variant(ll, peer, "batched", ref, metric))
    return pairs


def compute_ratios(result: dict, ref_c: int) -> tuple[dict, dict]:
    ef, hf, ll = result["edgefire"]["per_concurrency"], result["hf"], result["llama_cpp"]
    ref = str(ref_c)
    single_tg = _best(ll, "single", "decode_tok_s")
    if single_tg[0] is None:  # llama-bench did not report tg: batched-bench's C=1 S_TG
        single_tg = _best(ll, "batched", "1", "decode_tok_s")
    # ratio name: (edgefire's figure, llama.cpp's best for the same metric)
    pairs = {
        "single_decode_vs_llama_cpp": (_get(ef, "1", "per_request_decode_tok_s"), single_tg),
        # the same stream with speculative drafts off: the plain decode step's speed
        "single_decode_no_drafts_vs_llama_cpp": (
            _get(ef, "1", "without_speculation", "per_request_decode_tok_s"), single_tg),
        **{name: (_get(result["edgefire"], "quantized", *keys), single_tg)
           for variant in result["edgefire"].get("quantized", {})
           for name, keys in (
               (f"single_decode_{variant}_vs_llama_cpp",
                (variant, "per_request_decode_tok_s")),
               (f"single_decode_{variant}_no_drafts_vs_llama_cpp",
                (variant, "without_speculation", "per_request_decode_tok_s")))},
        "batch_vs_llama_cpp": (_get(ef, ref, "output_tok_s"),
                               _best(ll, "batched", ref, "output_tok_s")),
        "batch_decode_vs_llama_cpp": (_get(ef, ref, "decode_tok_s"),
                                      _best(ll, "batched", ref, "decode_tok_s")),
        "batch_decode_lockstep_vs_llama_cpp": (
            _get(result["edgefire"], "lockstep", ref, "decode_tok_s"),
            _best(ll, "batched", ref, "decode_tok_s")),
        "prefill_vs_llama_cpp": (_get(ef, ref, "prefill_tok_s"),
                                 _best(ll, "batched", ref, "prefill_tok_s")),
        # edgefire with prefill against llama.cpp without: the strictest batched comparison
        "batch_vs_llama_cpp_s_tg": (_get(ef, ref, "output_tok_s"),
                                    _best(ll, "batched", ref, "decode_tok_s")),
        "prefill_c1_vs_llama_cpp_single": (_get(ef, "1", "prefill_tok_s"),
                                           _best(ll, "single", "prefill_tok_s")),
        **_quantized_batch(result, ll, ref),
    }
    ratios: dict = {"reference_concurrency": ref_c}
    ratios |= {name: ratio(ours, theirs[0]) for name, (ours, theirs) in pairs.items()}
    ratios["batch_vs_hf"] = ratio(_get(ef, ref, "output_tok_s"),
                                  _get(hf, "per_concurrency", ref, "output_tok_s"))
    ratios["c64_decode_of_gemm_roofline"] = _roofline_fraction(
        result, _get(ef, "64", "decode_tok_s"))
    ratios["c64_lockstep_decode_of_gemm_roofline"] = _roofline_fraction(
        result, _get(result["edgefire"], "lockstep", "64", "decode_tok_s"))
    ratios["c64_memory_floor_of_gemm_roofline"] = _memory_floor_fraction(result)
    ratios["vs_llama_cpp"] = {name: {"edgefire": ours, "llama_cpp": theirs[0],
                                     "llama_cpp_variant": theirs[1]}
                              for name, (ours, theirs) in pairs.items()}
    # A target whose figure was not taken (no quantized run) stays, with no ratio.
    targets = {name: {"target": goal, "ratio": ratios.get(name),
                      "met": None if ratios.get(name) is None else ratios[name] >= goal,
                      "llama_cpp_variant": _get(ratios, "vs_llama_cpp", name,
                                                "llama_cpp_variant")}
               for name, goal in TARGETS.items()}
    return ratios, targets


def _roofline_fraction(result: dict, rate: float | None) -> float | None:
    """A decode rate (tok/s) times the model's matmul FLOPs per token, as a fraction of the
    GEMM roofline."""
    flop = result["edgefire"].get("decode_flop_per_token")
    peak = _get(result, "roofline", "gemm_tflop_s")
    if not (flop and rate and peak):
        return None
    return round(rate * flop / (peak * 1e12), 3)


def _memory_floor_fraction(result: dict) -> float | None:
    """C=64's decode rate if each step took only the time to read the weights once and each
    sequence's K/V once at the read rate measured beside it (activations, logits and any
    second read not counted), times the FLOPs per token, as a fraction of the GEMM roofline:
    an upper bound on c64_decode_of_gemm_roofline on this machine, as long as the model's
    weights and K/V are read in the dtype they are kept in."""
    ef = result["edgefire"]
    c64 = _get(ef, "per_concurrency", "64")
    flop, weights = ef.get("decode_flop_per_token"), ef.get("weight_bytes")
    kv = _get(result, "kv_bytes_per_token", "measured")
    read, peak = _get(result, "roofline", "read_gb_s"), _get(result, "roofline", "gemm_tflop_s")
    if not (c64 and flop and weights and kv and read and peak):
        return None
    sequences, new = c64["requests"], result["workload"]["max_new_tokens"]
    # A step's mean context: each prompt and, on average, half of what the sequence adds.
    context = c64["prompt_tokens"] + sequences * (new + 1) / 2
    rate = sequences * read * 1e9 / (weights + kv * context)
    return round(rate * flop / (peak * 1e12), 3)


def render_markdown(result: dict) -> str:
    ef, hf = result["edgefire"]["per_concurrency"], result["hf"]
    ll = result["llama_cpp"]
    rows = []
    for c in result["workload"]["concurrency"]:
        e = ef[str(c)]
        rows.append([c, e["output_tok_s"], e.get("decode_tok_s"), e["prefill_tok_s"],
                     f"{e['ttft_ms']['p50']} / {e['ttft_ms']['p99']}",
                     f"{e['itl_ms']['p50']} / {e['itl_ms']['p99']}",
                     _get(hf, "per_concurrency", str(c), "output_tok_s"),
                     *(_named(_best(ll, "batched", str(c), m))
                       for m in ("output_tok_s", "decode_tok_s", "prefill_tok_s"))])
    header = ["C", "edgefire out tok/s", "edgefire decode tok/s", "edgefire prefill tok/s",
              "TTFT p50/p99 ms", "ITL p50/p99 ms", f"HF ({hf.get('dtype', 'n/a')}) tok/s",
              "llama.cpp best out tok/s", "llama.cpp best S_TG", "llama.cpp best S_PP"]
    table = markdown_table(header, rows)
    targets = markdown_table(["ratio", "value", "target", "met", "vs llama.cpp"], [
        [name, t["ratio"], f">= {t['target']}", t["met"], t.get("llama_cpp_variant")]
        for name, t in result["targets"].items()])
    ref = str(result["ratios"]["reference_concurrency"])
    variants = markdown_table(
        ["llama.cpp variant", "single decode tok/s", "single prefill tok/s",
         f"C={ref} out tok/s", f"C={ref} S_TG", f"C={ref} S_PP"],
        [[name, _get(v, "single", "decode_tok_s"), _get(v, "single", "prefill_tok_s"),
          *(_get(v, "batched", ref, m) for m in ("output_tok_s", "decode_tok_s",
                                                 "prefill_tok_s"))]
         for name, v in (ll.get("variants") or {}).items() if v.get("available")])
    quantized = markdown_table(
        ["weights", "weight MB", "single decode tok/s", "without drafts", f"C={ref} out tok/s",
         f"C={ref} decode tok/s"],
        [[f"{name} ({q['weight_precision']})", round(q["weight_bytes"] / 1e6, 1),
          q["per_request_decode_tok_s"], q["without_speculation"]["per_request_decode_tok_s"],
          _get(q, "batch", "output_tok_s"), _get(q, "batch", "decode_tok_s")]
         for name, q in result["edgefire"].get("quantized", {}).items()])
    roof = result.get("roofline") or {}
    w = result["workload"]
    kv = result["kv_bytes_per_token"]
    model = ("SmolLM2-135M-Instruct (Q4_1 GGUF)" if result["gguf"]
             else f"{result['model']} ({result['miniature'] or 'from the catalog'})")
    return (f"{model}, {w['max_new_tokens']} new tokens, prompts "
            f"{w['prompt_len_range'][0]}-{w['prompt_len_range'][1]} tokens, "
            f"{result['machine']['cpu_count']} CPUs, {w['threads']} threads. "
            f"Peak RSS (process) {result['edgefire']['peak_rss_mib']} MiB. "
            + (f"edgefire weights: {result['edgefire']['weight_precision']}. "
               if result["edgefire"].get("weight_precision") else "")
            + f"KV cache ({kv['kv_dtype']}): {kv['measured']:g} bytes per token measured, "
            f"{kv['planned']} by formula"
            + (f"; the real model: {kv['real_model_bfloat16']} (bfloat16)"
               if "real_model_bfloat16" in kv else "")
            + (f" plus {kv['real_model_local_bfloat16_per_sequence']} per sequence for its "
               "chunked-local layers" if "real_model_local_bfloat16_per_sequence" in kv else "")
            + f". Roofline ({roof.get('threads')} threads): {roof.get('read_gb_s')} GB/s read, "
            f"{roof.get('gemm_tflop_s')} {roof.get('gemm_dtype')} GEMM TFLOP/s."
            + _floor_sentence(result["ratios"], result["edgefire"].get("lockstep"))
            + f"\n\n{table}\n{targets}" + (f"\n{variants}" if ll.get("variants") else "")
            + (f"\n{quantized}" if result["edgefire"].get("quantized") else ""))


def _floor_sentence(ratios: dict, lockstep: dict | None) -> str:
    floor = ratios.get("c64_memory_floor_of_gemm_roofline")
    if floor is None:
        return ""
    return (f" C=64 decode: {ratios['c64_decode_of_gemm_roofline']} of the GEMM roofline; "
            f"reading only the weights and each sequence's K/V at the measured read rate, a "
            f"step could reach at most {floor} of it."
            + "".join(f" C={c} in lockstep (one prompt length, every sequence decoding, as "
                      f"llama-batched-bench's S_TG): {row['decode_tok_s']} tok/s"
                      + (f", {ratios['c64_lockstep_decode_of_gemm_roofline']} of the roofline"
                         if c == "64" else "") + "."
                      for c, row in (lockstep or {}).items()))


def _named(best: tuple[float | None, str | None]) -> str | None:
    value, variant = best
    return None if value is None else f"{value} ({variant})"
