"""Start-up benchmark: from a request for an unloaded model to its first generated token.

Each start runs in a fresh subprocess, so nothing is cached in-process: edgefire with an empty
warm-start cache (cold), with the cache populated (warm), and HF transformers loading the same
GGUF (peer: `from_pretrained` load time, then one greedy token). The clock starts once imports
are done and plugins are loaded, as they are in a running node when the request arrives; edgefire
goes through the node's own load path (`build_served_model`). Medians over --repeats.

Run from the repository root: .venv/bin/python -m bench.startup [--repeats 3] [--dtype auto]
Output as every bench writes it (bench/_common.py): progress on stderr, one JSON object last
on stdout, the same and a table in bench/results/startup.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._common import (
    log,
    machine_info,
    markdown_table,
    ratio,
    run_with_peak_rss,
    stopwatch,
    write_results,
)

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
PROMPT = "The capital of France is"
TARGET_WARM_VS_HF_LOAD = 0.10  # warm start under 10% of the peer's load time
ROOT = Path(__file__).resolve().parent.parent
MODES = ("cold", "warm", "hf")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="auto", help="edgefire compute dtype (node default: auto)")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    p.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    return p.parse_args()


# ---------------------------------------------------------------- children: one start each


def _entries(cache_dir: str) -> int:
    return len([name for name in os.listdir(cache_dir) if not name.startswith(".")])


def _since_process_start() -> float:
    import psutil

    return round(time.time() - psutil.Process().create_time(), 3)


def child_edgefire(cache_dir: str, dtype: str) -> dict:
    os.environ["EDGEFIRE_CACHE_DIR"] = cache_dir
    import asyncio

    from edgefire.contract.catalog import Catalog
    from edgefire.runtime.engine.compute_thread import ComputeThread
    from edgefire.runtime.engine.sampling_params import SamplingParams
    from edgefire.runtime.node.served import build_served_model
    from edgefire.runtime.node.settings import NodeSettings
    from edgefire.runtime.plugins import load_plugins

    load_plugins()
    settings = NodeSettings(dtype=dtype)
    entries_before = _entries(cache_dir)
    ready_s = _since_process_start()

    async def first_token(served, ids: list[int]) -> int:
        stream = served.engine.add_request("startup", ids, SamplingParams(max_tokens=1,
                                                                          temperature=0))
        async for out in stream:
            return out.token_ids[0]
        raise RuntimeError("no token generated")

    compute = ComputeThread()
    start = time.perf_counter()
    spec = Catalog.load().get_runnable(MODEL)
    served = compute.submit(build_served_model, spec, settings, compute).result()
    load_s = time.perf_counter() - start
    ids = served.tokenizer.encode(PROMPT)
    token = asyncio.run(first_token(served, ids))
    first_token_s = time.perf_counter() - start
    served.close()
    compute.shutdown()
    return {"ready_s": ready_s, "load_s": round(load_s, 3),
            "first_token_s": round(first_token_s, 3), "token": token, "prompt_ids": ids,
            "cache_entries_before": entries_before, "cache_entries_after": _entries(cache_dir)}


def child_hf(prompt_ids: list[int]) -> dict:
    # Imported before the clock, as edgefire's modules are: load_hf imports these.
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, modeling_gguf_pytorch_utils  # noqa: F401

    from bench.peers import hf_generate, load_hf
    from edgefire.contract.catalog import Catalog
    from edgefire.runtime.weights import resolve_source

    gguf = resolve_source(Catalog.load().get_runnable(MODEL).weights)
    ready_s = _since_process_start()
    start = time.perf_counter()
    model = load_hf(gguf, torch.float32)
    load_s = time.perf_counter() - start
    hf_generate(model, [prompt_ids], 1)
    first_token_s = time.perf_counter() - start
    return {"ready_s": ready_s, "load_s": round(load_s, 3),
            "first_token_s": round(first_token_s, 3), "transformers": transformers.__version__}


# ---------------------------------------------------------------- parent


def run_child(mode: str, args: argparse.Namespace, cache_dir: str | None = None,
              prompt_ids: list[int] | None = None) -> dict:
    cmd = [sys.executable, "-m", "bench.startup", "--child", mode, "--dtype", args.dtype]
    if cache_dir is not None:
        cmd += ["--cache-dir", cache_dir]
    if prompt_ids is not None:
        cmd += ["--prompt-ids", json.dumps(prompt_ids)]
    with stopwatch() as wall:
        stdout, peak = run_with_peak_rss(cmd)
    result = json.loads(stdout.strip().splitlines()[-1])
    return {**result, "process_wall_s": round(wall[0], 3), "peak_rss_mib": peak}


def summarize(runs: list[dict]) -> dict:
    keys = ("first_token_s", "load_s", "ready_s", "process_wall_s", "peak_rss_mib")
    return {key: round(statistics.median(r[key] for r in runs), 3) for key in keys}


def measure(args: argparse.Namespace, scratch: Path) -> tuple[dict, dict[str, list[dict]]]:
    """The run that fills the warm cache, then every mode's runs."""
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    warm_dir = scratch / "warm"
    warm_dir.mkdir()
    prime = run_child("cold", args, str(warm_dir))  # fills the cache the warm starts read
    log(f"primed the warm cache in {prime['first_token_s']} s")
    for rep in range(args.repeats):
        cold_dir = scratch / f"cold-{rep}"
        cold_dir.mkdir()
        # Interleaved, so drifting machine load touches every mode alike.
        runs["cold"].append(run_child("cold", args, str(cold_dir)))
        runs["warm"].append(run_child("warm", args, str(warm_dir)))
        runs["hf"].append(run_child("hf", args, prompt_ids=prime["prompt_ids"]))
        log(f"rep {rep + 1}/{args.repeats}: " + ", ".join(
            f"{mode} {runs[mode][-1]['first_token_s']} s" for mode in MODES))
    bad = [r for r in runs["warm"] if r["cache_entries_before"] != 1]
    bad += [r for r in runs["cold"] if r["cache_entries_before"] != 0]
    if bad:
        raise RuntimeError(f"cache state was not what the mode needs: {bad}")
    return prime, runs


def render_markdown(result: dict) -> str:
    m, r = result["median"], result["ratios"]
    rows = [[mode, m[mode]["first_token_s"], m[mode]["load_s"], m[mode]["ready_s"],
             m[mode]["process_wall_s"], m[mode]["peak_rss_mib"]] for mode in MODES]
    header = ["start", "request → first token s", "load s", "interpreter + imports s",
              "process wall s", "peak RSS MiB"]
    t = result["target"]
    return (f"SmolLM2-135M-Instruct (Q4_1 GGUF), edgefire dtype {result['dtype']}, HF float32, "
            f"median of {result['repeats']} fresh processes each, "
            f"{result['machine']['cpu_count']} CPUs.\n\n{markdown_table(header, rows)}\n"
            f"warm / HF load {r['warm_vs_hf_load']} (target < {t['target']}: "
            f"{'met' if t['met'] else 'not met'}); warm / cold {r['warm_vs_cold']}; "
            f"warm / HF first token {r['warm_vs_hf_first_token']}.\n")


def main(args: argparse.Namespace) -> None:
    machine = machine_info()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="edgefire-startup-") as scratch:
        prime, runs = measure(args, Path(scratch))
    median = {mode: summarize(mode_runs) for mode, mode_runs in runs.items()}
    warm, cold, hf = median["warm"], median["cold"], median["hf"]
    ratios = {"warm_vs_hf_load": ratio(warm["first_token_s"], hf["load_s"]),
              "warm_vs_cold": ratio(warm["first_token_s"], cold["first_token_s"]),
              "warm_vs_hf_first_token": ratio(warm["first_token_s"], hf["first_token_s"])}
    met = ratios["warm_vs_hf_load"] is not None and (
        ratios["warm_vs_hf_load"] < TARGET_WARM_VS_HF_LOAD)
    machine["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "bench": "startup", "model": MODEL, "dtype": args.dtype, "hf_dtype": "float32",
        "repeats": args.repeats, "machine": machine, "median": median, "ratios": ratios,
        "target": {"name": "warm_vs_hf_load", "target": TARGET_WARM_VS_HF_LOAD,
                   "ratio": ratios["warm_vs_hf_load"], "met": met},
        "prime": prime, "runs": runs,
        "notes": "first_token_s: request for the unloaded model -> first token, after imports "
                 "and plugin loading (ready_s: process start -> that point). HF: load_s is "
                 "from_pretrained, first_token_s adds generate(max_new_tokens=1). Warm starts "
                 "read the cache file through the page cache (it was just written): a cache on "
                 "a cold disk adds its read time. peak_rss_mib counts mapped file pages touched.",
    }
    markdown = render_markdown(result)
    log("\n" + markdown)
    write_results("startup", result, markdown)


def child_main(args: argparse.Namespace) -> None:
    if args.child == "hf":
        result = child_hf(json.loads(args.prompt_ids))
    else:
        result = child_edgefire(args.cache_dir, args.dtype)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    parsed = parse_args()
    if parsed.child:
        child_main(parsed)
    else:
        main(parsed)
