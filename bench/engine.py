"""Benchmark the offline engine on SmolLM2-135M against HF transformers and llama.cpp.

Run from the repository root: .venv/bin/python -m bench.engine [--quick] [--model ID]
`--model` runs another catalog model (a miniature such as @cf/kimi-k2.5) without the peers,
which read only SmolLM2's GGUF; its results go to bench/results/engine-<model>.{json,md}.
Every run reports the KV cache's bytes per token, measured on the pool against the formula.
llama.cpp runs on the shipped Q4_1 GGUF and its Q8_0 and BF16 rewrites (bench/gguf_variants.py,
--llama-variants); each ratio is against the best of them for that metric, and names it.
The machine's read bandwidth and bf16 GEMM throughput are recorded under "roofline".
Output as every bench writes it (bench/_common.py): progress on stderr, one JSON object last
on stdout, the same and a table in bench/results/engine.{json,md}.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench._common import (
    log,
    machine_info,
    make_prompts,
    peak_rss_mib,
    percentiles,
    prompt_lengths,
    rate,
    write_results,
)
from bench.engine_report import compute_ratios, render_markdown
from bench.gguf_variants import FORMATS, SHIPPED, ensure_variants
from bench.peers import llama_bin, run_hf, run_llama
from bench.roofline import measure_roofline
from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.models.llama import LlamaConfig
from edgefire.runtime import LLM, EngineConfig, SamplingParams
from edgefire.runtime.weights import resolve_source

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
PROMPT_RANGE = (64, 512)
LLAMA_VARIANTS = ",".join([SHIPPED, *FORMATS])


@dataclass(slots=True)
class Trace:
    """Token arrival times (seconds since all requests were submitted) per request."""

    wall_s: float
    arrivals: dict[str, list[float]] = field(default_factory=dict)
    cached_tokens: int = 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default=None, help="comma list (default 1,8,32,64)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (quick: 32)")
    p.add_argument("--quick", action="store_true", help="smoke run: C=1,4 and 32 new tokens")
    p.add_argument("--model", default=MODEL, help=f"catalog id or alias (default {MODEL})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-hf-above", type=int, default=None, metavar="N",
                   help="skip the HF peer for concurrency above N")
    p.add_argument("--quantized", default="int8,int4",
                   help="the model's quantized catalog variants (id suffixes) timed single "
                        "stream in the same run; empty: none")
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--llama-bin", default=None, help="folder with llama-batched-bench/-bench")
    p.add_argument("--build-llama", action="store_true",
                   help="run ../shared/peers/build-llama-cpp if the tools are missing")
    p.add_argument("--llama-reps", type=int, default=None, help="llama-bench -r (default 3)")
    p.add_argument("--llama-variants", default=LLAMA_VARIANTS,
                   help=f"GGUF variants llama.cpp runs on (default {LLAMA_VARIANTS})")
    args = p.parse_args()
    default_c = "1,4" if args.quick else "1,8,32,64"
    args.concurrency = [int(c) for c in (args.concurrency or default_c).split(",")]
    args.max_new_tokens = args.max_new_tokens or (32 if args.quick else 128)
    args.llama_reps = args.llama_reps or (1 if args.quick else 3)
    args.llama_variants = [v.strip() for v in args.llama_variants.split(",") if v.strip()]
    args.quantized = [v.strip() for v in args.quantized.split(",") if v.strip()]
    return args


def drive(llm: LLM, prompts: list[list[int]], max_tokens: int, tag: str) -> Trace:
    """Submit every prompt at t=0, then step the engine until all finish."""
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    trace = Trace(0.0, {f"{tag}-{i}": [] for i in range(len(prompts))})
    start = time.perf_counter()
    for request_id, prompt in zip(trace.arrivals, prompts, strict=True):
        engine.add_request(request_id, prompt, params)
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter() - start
        for out in outputs:
            trace.arrivals[out.request_id].extend([now] * len(out.token_ids))
            if out.finished and out.usage is not None:
                trace.cached_tokens += out.usage.cached_tokens
    trace.wall_s = time.perf_counter() - start
    return trace


def summarize(trace: Trace, prefill: Trace, prompts: list[list[int]],
              prefill_tokens: int) -> dict:
    times = list(trace.arrivals.values())
    generated = sum(len(t) for t in times)
    gaps = [float(g) for t in times for g in np.diff(t)]
    decode_rates = [(len(t) - 1) / (t[-1] - t[0]) for t in times if len(t) > 1 and t[-1] > t[0]]
    decode_tok_s = round(float(np.mean(decode_rates)), 2) if decode_rates else None
    # Decode only, all sequences together (llama-batched-bench's S_TG): the tokens that arrive
    # once every request has its first one (no prefill left) over the time they took. Requests
    # that started early finish early, so the batch thins out at the end: a conservative figure.
    firsts = [t[0] for t in times if t]
    start = max(firsts, default=0.0)
    end = max((t[-1] for t in times if t), default=0.0)
    after = sum(1 for t in times for x in t if x > start)
    return {
        "requests": len(prompts), "prompt_tokens": sum(map(len, prompts)),
        "output_tokens": generated, "wall_s": round(trace.wall_s, 3),
        "output_tok_s": rate(generated, trace.wall_s),
        "prefill_tok_s": rate(prefill_tokens, prefill.wall_s),
        "prefill_wall_s": round(prefill.wall_s, 3),
        "per_request_decode_tok_s": decode_tok_s,
        "decode_tok_s": rate(after, end - start) if after else None,
        "ttft_ms": percentiles([t[0] for t in times if t], 1000),
        "itl_ms": percentiles(gaps, 1000),
        "end_s": percentiles([t[-1] for t in times if t]),
        "cached_tokens": trace.cached_tokens + prefill.cached_tokens,
    }


def run_edgefire(llm: LLM, workloads: dict[int, list[list[int]]], max_new: int,
                 seed: int) -> dict[str, dict]:
    encode = _encoder(llm)
    drive(llm, make_prompts(encode, [64, 200], seed + 2, "warmup"), 4, "warmup")
    per_c = {str(c): run_concurrency(llm, prompts, c, max_new, seed)
             for c, prompts in workloads.items()}
    if "1" in per_c and llm.engine.speculator.config.mode != "off":
        per_c["1"]["without_speculation"] = without_drafts(llm, workloads[1], max_new)
        log(f"edgefire C=1 without drafts: {per_c['1']['without_speculation']}")
    return per_c


def run_concurrency(llm: LLM, prompts: list[list[int]], c: int, max_new: int, seed: int,
                    label: str = "edgefire") -> dict:
    """One concurrency's workload: its prefill alone (prompts of the same lengths, other text:
    the prefix cache must not serve the main run), then the run itself, with its drafts."""
    prefill_prompts = make_prompts(_encoder(llm), [len(p) for p in prompts], seed + 1, f"pf{c}")
    prefill = drive(llm, prefill_prompts, 1, f"prefill-c{c}")
    spec = llm.engine.speculator
    before = (spec.num_steps, spec.num_proposed, spec.num_accepted)
    trace = drive(llm, prompts, max_new, f"run-c{c}")
    row = summarize(trace, prefill, prompts, sum(map(len, prefill_prompts)))
    steps, proposed, accepted = (now - was for now, was in zip(
        (spec.num_steps, spec.num_proposed, spec.num_accepted), before, strict=True))
    row["speculative"] = {
        "mode": spec.config.mode, "verify_steps": steps, "proposed": proposed,
        "accepted": accepted, "acceptance": round(accepted / proposed, 3) if proposed else None}
    log(f"{label} C={c}: out {row['output_tok_s']} tok/s, prefill {row['prefill_tok_s']} "
        f"tok/s, TTFT {row['ttft_ms']} ms, ITL {row['itl_ms']} ms, drafts {row['speculative']}")
    return row


def run_lockstep(llm: LLM, concurrency: list[int], prompt_len: int, max_new: int,
                 seed: int) -> dict[str, dict]:
    """Each concurrency as llama-batched-bench times its S_TG: `c` prompts of one length (the
    length llama.cpp is given), submitted together, drafts off, decode tok/s over the steps in
    which every sequence decodes (from the last first token to the first sequence's end).
    The main workload's decode figure (summarize) spans a batch that thins out as requests of
    other lengths finish; this one is each step at its full `c` rows."""
    out = {}
    speculator = llm.engine.speculator
    mode, speculator.config.mode = speculator.config.mode, "off"
    try:
        for c in concurrency:
            prompts = make_prompts(_encoder(llm), [prompt_len] * c, seed + 3 + c, f"lock{c}")
            trace = drive(llm, prompts, max_new, f"lockstep-c{c}")
            span, tok_s = full_batch_rate(list(trace.arrivals.values()))
            out[str(c)] = {"prompt_tokens": prompt_len, "full_steps_s": round(span, 3),
                           "decode_tok_s": tok_s}
            log(f"edgefire lockstep C={c}: {out[str(c)]}")
    finally:
        speculator.config.mode = mode
    return out


def full_batch_rate(times: list[list[float]]) -> tuple[float, float | None]:
    """Token arrival times per sequence -> (seconds, tok/s) over the span in which every
    sequence decodes: after the last first token, up to the first sequence's last token."""
    start, stop = max(t[0] for t in times), min(t[-1] for t in times)
    tokens = sum(1 for t in times for x in t if start < x <= stop)
    return max(stop - start, 0.0), rate(tokens, stop - start) if tokens else None


def peer_prompt_length(workloads: dict[int, list[list[int]]]) -> int:
    """The one prompt length llama-batched-bench takes: the workloads' mean."""
    return round(float(np.mean([len(p) for ps in workloads.values() for p in ps])))


def without_drafts(llm: LLM, prompts: list[list[int]], max_new: int) -> dict:
    """The same stream with speculative drafts off: plain decode speed, and what drafts add."""
    mode = llm.engine.speculator.config.mode
    llm.engine.speculator.config.mode = "off"
    try:
        plain = drive(llm, prompts, max_new, "plain")
    finally:
        llm.engine.speculator.config.mode = mode
    row = summarize(plain, plain, prompts, 0)
    return {key: row[key] for key in ("output_tok_s", "per_request_decode_tok_s", "itl_ms")}


def run_quantized(model_id: str, suffixes: list[str], config: EngineConfig,
                  prompts: list[list[int]], max_new: int, seed: int,
                  batch: tuple[int, list[list[int]]] | None) -> dict[str, dict]:
    """Single-stream decode of each quantized variant (the catalog's `<model>-<suffix>`), with
    the default drafts and without, over the C=1 workload; and `batch`'s workload (the
    reference concurrency), as the dense weights run it, for the batched ratios at equal
    precision (engine_report.py)."""
    out = {}
    for suffix in suffixes:
        llm = LLM(f"{model_id}-{suffix}", engine_config=config)
        drive(llm, make_prompts(_encoder(llm), [64, 200], seed + 2, "warmup"), 4, "warmup")
        trace = drive(llm, prompts, max_new, f"{suffix}-c1")
        row = summarize(trace, trace, prompts, 0)
        out[suffix] = {"weight_precision": llm.model.weight_precision,
                       "weight_bytes": llm.model.weight_bytes,
                       "per_request_decode_tok_s": row["per_request_decode_tok_s"],
                       "without_speculation": without_drafts(llm, prompts, max_new)}
        log(f"edgefire {suffix} C=1: {out[suffix]}")
        if batch is not None:
            c, batch_prompts = batch
            out[suffix]["batch"] = {"concurrency": c, **run_concurrency(
                llm, batch_prompts, c, max_new, seed, f"edgefire {suffix}")}
        del llm
        gc.collect()
    return out


def decode_flop_per_token(llm: LLM) -> int | None:
    """The multiply-adds of a dense Llama's matmuls for one decoded token, ×2 (every
    projection and the LM head; attention's own products, which grow with the context, not
    counted): what the C=64 decode rate is set against the GEMM roofline with. None for other
    architectures (the MoE miniatures: their work per token depends on the routing)."""
    c = getattr(llm.model, "config", None)
    if not isinstance(c, LlamaConfig):
        return None
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    # qkv, o, and gate, up and down
    layer = c.hidden_size * (q + 2 * kv + q) + 3 * c.hidden_size * c.intermediate_size
    return 2 * (c.num_layers * layer + c.vocab_size * c.hidden_size)


def _encoder(llm: LLM) -> Callable[[str], list[int]]:
    return lambda text: llm.tokenizer.encode(text, add_special_tokens=False)


def kv_bytes_per_token(llm: LLM, spec: ModelSpec) -> dict:
    """The pool's bytes per token slot, and the same from the config's formula: MLA keeps the
    latent and the RoPE key per layer, attention with K/V heads keeps both per head. For a
    miniature, also what the real model (catalog `config:`, bfloat16 cache) would keep."""
    engine = llm.engine
    measured = engine.runner.kv_cache.nbytes / (engine.blocks.num_blocks * engine.config.block_size)
    itemsize = llm.model.kv_dtype.itemsize
    out = {"kv_dtype": str(llm.model.kv_dtype).removeprefix("torch."), "measured": measured,
           "planned": _kv_values(asdict(llm.model.config)) * itemsize}
    if "miniature" in spec.extra:
        real = spec.extra["config"]
        out["real_model_bfloat16"] = _kv_values(real, full_length_only=True) * 2
        if real.get("attention_chunk_size"):  # and each local layer keeps up to a chunk
            local = _kv_values(real) - _kv_values(real, full_length_only=True)
            out["real_model_local_bfloat16_per_sequence"] = local * 2 * real[
                "attention_chunk_size"]
    return out


def _kv_values(c: dict, full_length_only: bool = False) -> int:
    if c.get("kv_lora_rank"):  # multi-head latent attention
        return c["num_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
    heads = c.get("num_kv_heads") or c["num_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_heads"]
    layers = c["num_layers"]
    if full_length_only and c.get("attention_chunk_size"):
        # Llama 4: only the global (NoPE) layers, one in no_rope_layer_interval, keep KV for
        # the whole context in its deployment; this engine's pool keeps it in every layer.
        layers //= c["no_rope_layer_interval"]
    return layers * 2 * heads * head_dim


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()
    spec = Catalog.load().get_runnable(args.model)
    # The peers read SmolLM2's GGUF; any other model runs alone.
    gguf = Path(resolve_source(spec.weights)) if spec.id == MODEL else None
    if gguf is None:
        args.skip_llama = args.skip_hf = True
    config = EngineConfig(kv_cache_bytes=3 << 30, max_num_seqs=64, max_num_batched_tokens=1024)
    log(f"loading {spec.id} from {gguf or spec.weights}")
    llm = LLM(spec.id, engine_config=config)
    encode = _encoder(llm)
    workloads = {c: make_prompts(encode, prompt_lengths(c, *PROMPT_RANGE, args.seed + c),
                                 args.seed + c, f"c{c}") for c in args.concurrency}
    ref_c = 32 if 32 in workloads else max(workloads)
    edgefire = {"engine_config": asdict(llm.engine.config),
                "per_concurrency": run_edgefire(llm, workloads, args.max_new_tokens, args.seed)}
    if spec.id == MODEL:  # beside the peers' S_TG, at their prompt length
        edgefire["lockstep"] = run_lockstep(
            llm, sorted({ref_c, 64} & set(workloads)), peer_prompt_length(workloads),
            args.max_new_tokens, args.seed)
    edgefire["peak_rss_mib"] = peak_rss_mib()
    edgefire["weight_precision"] = getattr(llm.model, "weight_precision", None)
    edgefire["decode_flop_per_token"] = decode_flop_per_token(llm)
    edgefire["weight_bytes"] = llm.model.weight_bytes
    kv = kv_bytes_per_token(llm, spec)
    log(f"KV bytes per token: {kv}")
    del llm
    gc.collect()
    if 1 in workloads and spec.id == MODEL:
        edgefire["quantized"] = run_quantized(spec.id, args.quantized, config, workloads[1],
                                              args.max_new_tokens, args.seed,
                                              (ref_c, workloads[ref_c]) if ref_c > 1 else None)
    result = {
        "bench": "engine", "model": spec.id, "gguf": str(gguf) if gguf else None,
        "miniature": spec.miniature, "kv_bytes_per_token": kv, "quick": args.quick,
        "workload": {"concurrency": args.concurrency, "prompt_len_range": list(PROMPT_RANGE),
                     "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                     "greedy": True, "ignore_eos": True, "threads": args.threads},
        "machine": machine, "roofline": measure_roofline(), "edgefire": edgefire,
        "llama_cpp": llama_peer(args, gguf, workloads),
        "hf": hf_peer(args, gguf, workloads, ref_c),
        "notes": "edgefire/HF peak RSS is ru_maxrss of this process (edgefire's is taken before "
                 "HF loads; HF's includes everything before it); llama.cpp's is each tool's "
                 "VmHWM",
    }
    result["ratios"], result["targets"] = compute_ratios(result, ref_c)
    result["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    markdown = render_markdown(result)
    log("\n" + markdown)
    write_results("engine" if spec.id == MODEL else f"engine-{spec.id.rsplit('/', 1)[-1]}",
                  result, markdown)


def llama_peer(args: argparse.Namespace, gguf: Path, workloads: dict) -> dict:
    if args.skip_llama:
        return {"available": False, "note": "skipped (--skip-llama)"}
    folder = llama_bin(args.llama_bin, args.build_llama)
    if folder is None:
        return {"available": False,
                "note": "llama.cpp tools not found; run bash ../shared/peers/build-llama-cpp"}
    pp = peer_prompt_length(workloads)
    try:
        ggufs = ensure_variants(gguf, args.llama_variants)
        return run_llama(folder, ggufs, pp, args.max_new_tokens, list(workloads), args.threads,
                         args.llama_reps)
    except (subprocess.CalledProcessError, ValueError, OSError) as exc:
        log(f"llama.cpp failed: {exc}\n{(getattr(exc, 'stderr', '') or '')[-2000:]}")
        return {"available": False, "note": f"llama.cpp failed: {exc}"}


def hf_peer(args: argparse.Namespace, gguf: Path, workloads: dict, ref_c: int) -> dict:
    if args.skip_hf:
        return {"available": False, "note": "skipped (--skip-hf)"}
    limit = args.skip_hf_above
    allowed = {c: p for c, p in workloads.items() if limit is None or c <= limit}
    if not allowed:
        return {"available": False, "note": f"every concurrency is above --skip-hf-above {limit}"}
    probe_c = ref_c if ref_c in allowed else max(allowed)
    try:
        result = run_hf(gguf, allowed, args.max_new_tokens, probe_c)
    except Exception as exc:  # a failing peer must not lose the edgefire figures
        log(f"HF peer failed: {exc!r}")
        return {"available": False, "note": f"HF peer failed: {exc!r}"}
    result["skipped_concurrency"] = sorted(set(workloads) - set(allowed))
    return result


if __name__ == "__main__":
    main()
