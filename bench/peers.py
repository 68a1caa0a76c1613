"""Peer engines: HF transformers `generate` on the shipped GGUF, llama.cpp's bench tools on it
and its Q8_0/BF16 rewrites (bench/gguf_variants.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch

from bench._common import log, peak_rss_mib, rate, run_with_peak_rss, stopwatch

LLAMA_TOOLS = ("llama-batched-bench", "llama-bench")
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "peers" / "build-llama-cpp"


# ---------------------------------------------------------------- HF transformers


def load_hf(gguf: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)  # quiet the dequant bar
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=dtype)
    return model.eval()


def hf_generate(model: torch.nn.Module, prompts: Sequence[list[int]], max_new: int) -> float:
    """Static batch, left-padded, greedy, exactly max_new tokens each; returns seconds."""
    pad = model.generation_config.eos_token_id
    pad = (pad[0] if isinstance(pad, list) else pad) or 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    with torch.inference_mode(), stopwatch() as elapsed:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                             min_new_tokens=max_new, do_sample=False, pad_token_id=pad)
    if out.shape[1] - width != max_new:
        raise RuntimeError(f"HF generated {out.shape[1] - width} tokens, wanted {max_new}")
    return elapsed[0]


def _hf_point(model: torch.nn.Module, prompts: Sequence[list[int]], max_new: int) -> dict:
    seconds = hf_generate(model, prompts, max_new)
    return {"requests": len(prompts), "wall_s": round(seconds, 3),
            "output_tok_s": rate(len(prompts) * max_new, seconds)}


def run_hf(gguf: Path, workloads: dict[int, list[list[int]]], max_new: int,
           probe_c: int) -> dict:
    """Probe float32 vs bfloat16 at probe_c, then run every concurrency with the faster dtype."""
    probe: dict[str, dict] = {}
    best: tuple[float, str, torch.nn.Module] | None = None
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model = load_hf(gguf, dtype)
        hf_generate(model, workloads[probe_c][:2], 4)  # warm-up
        point = _hf_point(model, workloads[probe_c], max_new)
        probe[name] = point
        log(f"hf {name} C={probe_c}: {point['output_tok_s']} tok/s")
        if best is None or point["output_tok_s"] > best[0]:
            best = (point["output_tok_s"], name, model)
        else:
            del model
    assert best is not None
    _, dtype_name, model = best
    per_c: dict[str, dict] = {}
    for c, prompts in workloads.items():
        if c == probe_c:
            per_c[str(c)] = {**probe[dtype_name], "from_probe": True}
            continue
        per_c[str(c)] = _hf_point(model, prompts, max_new)
        log(f"hf {dtype_name} C={c}: {per_c[str(c)]['output_tok_s']} tok/s")
    from transformers import __version__ as version

    return {"available": True, "transformers": version, "dtype": dtype_name,
            "dtype_probe": {"concurrency": probe_c,
                            "output_tok_s": {k: v["output_tok_s"] for k, v in probe.items()}},
            "per_concurrency": per_c,
            "peak_rss_mib_process": peak_rss_mib()}


# ---------------------------------------------------------------- llama.cpp


def default_llama_folder() -> Path:
    """Where ../shared/peers/build-llama-cpp puts llama.cpp's binaries."""
    root = os.environ.get("EDGEFIRE_PEERS", str(Path.home() / ".cache/edgefire-peers"))
    return Path(root) / "llama.cpp" / "bin"


def llama_bin(explicit: str | None, build: bool) -> Path | None:
    """The folder holding llama.cpp's bench tools, or None when they are not built."""
    if explicit:
        folder = Path(explicit)
    elif build and BUILD_SCRIPT.exists():
        out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
        folder = Path(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else Path()
    else:
        folder = default_llama_folder()
    ok = all(os.access(folder / tool, os.X_OK) for tool in LLAMA_TOOLS)
    return folder if ok else None


def _jsonl(cmd: list[str], peaks: list[float]) -> list[dict]:
    log("$ " + " ".join(cmd))
    stdout, peak = run_with_peak_rss(cmd)
    peaks.append(peak)
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def run_llama_variant(folder: Path, gguf: Path, pp: int, tg: int, npl: Sequence[int],
                      threads: int, repetitions: int) -> dict:
    """llama-batched-bench at every concurrency and llama-bench single-stream, on one GGUF."""
    ctx = max(npl) * (pp + tg) + 256
    peaks: list[float] = []
    rows = _jsonl([str(folder / "llama-batched-bench"), "-m", str(gguf), "-c", str(ctx),
                   "-b", "2048", "-ub", "512", "-npp", str(pp), "-ntg", str(tg),
                   "-npl", ",".join(map(str, npl)), "-t", str(threads),
                   "--output-format", "jsonl"], peaks)
    batched = {str(r["pl"]): {
        "prefill_tok_s": round(r["speed_pp"], 2), "decode_tok_s": round(r["speed_tg"], 2),
        "output_tok_s": rate(r["pl"] * r["tg"], r["t"]), "wall_s": round(r["t"], 3),
    } for r in rows}
    single_rows = _jsonl([str(folder / "llama-bench"), "-m", str(gguf), "-p", str(pp),
                          "-n", str(tg), "-t", str(threads), "-r", str(repetitions),
                          "-o", "jsonl"], peaks)
    single = {"prefill_tok_s": None, "decode_tok_s": None, "build_commit": None}
    for r in single_rows:
        key = "prefill_tok_s" if r["n_prompt"] else "decode_tok_s"
        single[key] = round(r["avg_ts"], 2)
        single["build_commit"] = r.get("build_commit")
    return {"available": True, "gguf": str(gguf), "ctx": ctx, "batched": batched,
            "single": single, "peak_rss_mib": {"batched_bench": peaks[0], "bench": peaks[1]}}


# The metrics each ratio reads; "best" keeps the highest of each over the variants.
SINGLE_METRICS = ("decode_tok_s", "prefill_tok_s")
BATCHED_METRICS = ("output_tok_s", "decode_tok_s", "prefill_tok_s")


def best_of(variants: dict[str, dict]) -> dict:
    """Per metric, the highest value over the variants that ran and which variant gave it."""
    def pick(*keys: str) -> dict:
        found = []
        for name, v in variants.items():
            value = v
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, int | float):
                found.append((value, name))
        value, name = max(found) if found else (None, None)
        return {"value": value, "variant": name}

    concurrencies = sorted({c for v in variants.values() for c in v.get("batched", {})}, key=int)
    return {"single": {m: pick("single", m) for m in SINGLE_METRICS},
            "batched": {c: {m: pick("batched", c, m) for m in BATCHED_METRICS}
                        for c in concurrencies}}


def run_llama(folder: Path, ggufs: dict[str, Path], pp: int, tg: int, npl: Sequence[int],
              threads: int, repetitions: int) -> dict:
    """Every variant (q4_1, q8_0, bf16: bench/gguf_variants.py) in turn, then the best of each
    metric: llama.cpp is compared at whichever weight format serves that metric best."""
    variants: dict[str, dict] = {}
    for name, gguf in ggufs.items():
        try:
            variants[name] = run_llama_variant(folder, gguf, pp, tg, npl, threads, repetitions)
        except (subprocess.CalledProcessError, KeyError, ValueError) as exc:
            log(f"llama.cpp {name} failed: {exc}\n{(getattr(exc, 'stderr', '') or '')[-2000:]}")
            variants[name] = {"available": False, "gguf": str(gguf),
                              "note": f"llama.cpp failed: {exc}"}
            continue
        v = variants[name]
        for c, row in v["batched"].items():
            log(f"llama.cpp {name} C={c}: out {row['output_tok_s']} tok/s, "
                f"S_TG {row['decode_tok_s']}, S_PP {row['prefill_tok_s']}")
        log(f"llama.cpp {name} single: pp{pp} {v['single']['prefill_tok_s']} tok/s, "
            f"tg{tg} {v['single']['decode_tok_s']} tok/s")
    ran = {name: v for name, v in variants.items() if v["available"]}
    return {"available": bool(ran), "bin": str(folder), "pp": pp, "tg": tg,
            "threads": threads, "variants": variants, "best": best_of(ran),
            "note": "llama-batched-bench uses one prompt length (pp) for all sequences; "
                    "output_tok_s = pl*tg / total time incl. prefill, decode_tok_s = S_TG, "
                    "prefill_tok_s = S_PP; best = the highest of each metric over the "
                    "variants (q4_1 is the shipped GGUF, q8_0/bf16 rewrites of it)"}
