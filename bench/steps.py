"""Decode steps per weight form and row count: SmolLM2 in BF16, INT8, INT4 and Unweight, ms a
step through the fused step (taken past the engine's limit too) and through torch's path, and
the most rows the engine lets the fused step take on this machine (max_rows in
models/fused/llama_decode.py), so each form's crossover is read off one run; and a prompt's
prefill both ways, with which of the two the engine takes (takes_prompts). Where the process
may use AMX tiles, the fused step is timed again with them refused (EDGEFIRE_AMX_TILES=0, in a
child process: the kernel decides once per process), the dot-product kernels alone.

Run from the repository root: .venv/bin/python -m bench.steps [--quick]
Output as every bench writes it (bench/_common.py): progress on stderr, one JSON object last
on stdout, the same and a table in bench/results/steps.{json,md}.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch

from bench._common import log, machine_info, markdown_table, write_results
from bench.kernels import MODEL, step_times
from bench.roofline import measure_roofline
from edgefire.models.fused import MAX_ROWS, fused_kernels
from edgefire.runtime import LLM, EngineConfig, SamplingParams

PROMPT_TOKENS = 385  # about the engine bench's prompts (~270) and a chunk's worth more
FORMS = {"bf16": MODEL, "int8": f"{MODEL}-int8", "int4": f"{MODEL}-int4",
         "unweight": f"{MODEL}-unweight"}


def form_steps(model_id: str, rows: list[int], steps: int, fused_only: bool) -> dict:
    """ms a decode step fused (up to MAX_ROWS, whatever the engine's limit) and through torch,
    and a prompt's prefill both ways."""
    # Drafts off: each step is exactly `rows` decode rows.
    llm = LLM(model_id, engine_config=EngineConfig(dtype="auto", speculative="off"))
    engine_rows = llm.model.batch_invariant_decode_rows(torch.bfloat16)
    fused = llm.model._fused_step()  # the step object: its limits lifted for the timing
    engine_prompts = fused.takes_prompts
    fused.max_rows = MAX_ROWS
    times = step_times(llm, rows, steps)
    out = {"engine_max_rows": engine_rows, "engine_takes_prompts": engine_prompts,
           "weight_bytes": llm.model.weight_bytes,
           "weight_precision": llm.model.weight_precision,
           "fused_ms": {str(r): times[f"fused_{r}"]["model_ms"] for r in rows},
           "prefill_tok_s": {"fused": prefill_rate(llm, fused, True)}}
    if not fused_only:
        out["torch_ms"] = {str(r): times[f"torch_{r}"]["model_ms"] for r in rows}
        if f"torch_float32_{rows[0]}" in times:  # CPUs without native BF16: torch's fast dtype
            out["torch_float32_ms"] = {str(r): times[f"torch_float32_{r}"]["model_ms"]
                                       for r in rows}
        out["prefill_tok_s"]["torch"] = prefill_rate(llm, fused, False)
    del llm, fused
    gc.collect()
    return out


def prefill_rate(llm: LLM, fused, in_step: bool, repeats: int = 3) -> float:
    """Tokens a second of one PROMPT_TOKENS-token prompt's prefill (and its first token), best
    of `repeats`, its prompt in the fused step or on torch's path (in the dtype the engine
    gives prompts it does not take: float32 on AVX2)."""
    fused.takes_prompts = in_step
    # On AVX2 the fused step takes prompts only in bfloat16 (ModelRunner.small_prompts)
    llm.engine.runner.small_prompts = in_step and llm.engine.runner.precision.small_decodes_only
    prompt = llm.tokenizer.encode("The history of Frankfurt am Main " * 60)[:PROMPT_TOKENS - 1]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    best = float("inf")
    for i in range(repeats):  # a first token of its own: the prefix cache must not serve it
        llm.engine.add_request(f"prefill-{in_step}-{i}", [1000 + 2 * i + in_step, *prompt],
                               params)
        start = time.perf_counter()
        while llm.engine.has_unfinished():
            llm.engine.step()
        best = min(best, time.perf_counter() - start)
    return round(PROMPT_TOKENS / best, 1)


def without_tiles(args: argparse.Namespace) -> dict:
    """The fused timings again in a child process refused the AMX tiles."""
    env = {**os.environ, "EDGEFIRE_AMX_TILES": "0"}
    cmd = [sys.executable, "-m", "bench.steps", "--fused-only", "--steps", str(args.steps),
           "--rows", ",".join(map(str, args.rows)), "--threads", str(args.threads)]
    done = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def render(result: dict) -> str:
    rows = []
    for form, entry in result["forms"].items():
        dot = result.get("without_tiles", {}).get(form, {}).get("fused_ms", {})
        float32 = entry.get("torch_float32_ms", {})
        for r, fused in entry["fused_ms"].items():
            torch_ms = entry["torch_ms"][r]
            rows.append([form, r, fused, dot.get(r, "–"), torch_ms, float32.get(r, "–"),
                         round(torch_ms / fused, 2),
                         "fused" if int(r) <= entry["engine_max_rows"] else "torch"])
    prefill = []
    for form, entry in result["forms"].items():
        dot = result.get("without_tiles", {}).get(form, {}).get("prefill_tok_s", {})
        rates = entry["prefill_tok_s"]
        prefill.append([form, rates["fused"], dot.get("fused", "–"), rates["torch"],
                        round(rates["fused"] / rates["torch"], 2),
                        "fused" if entry["engine_takes_prompts"] else "torch"])
    bw = result["roofline"]["read_gb_s"]
    return (f"# Decode steps per weight form (SmolLM2-135M)\n\nMachine: measured read bandwidth "
            f"{bw} GB/s, {result['roofline']['gemm_dtype']} GEMM "
            f"{result['roofline']['gemm_tflop_s']} TFLOP/s; AMX tiles in this process: "
            f"{result['amx_tiles']}. ms of the model's forward and logits per decode step; "
            f"\"without tiles\": the fused step with AMX refused (EDGEFIRE_AMX_TILES=0); "
            f"\"torch float32\": torch's path in float32, where the model holds it (CPUs "
            f"without native BF16).\n\n"
            + markdown_table(["form", "rows", "fused ms", "fused without tiles ms", "torch ms",
                              "torch float32 ms", "torch / fused", "engine runs"], rows)
            + f"\n## Prefill of a {PROMPT_TOKENS}-token prompt, tok/s\n\n"
            + markdown_table(["form", "fused", "fused without tiles", "torch", "fused / torch",
                              "engine runs"], prefill))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rows", default="1,4,8,16,32,64")
    p.add_argument("--fused-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    if args.quick:
        args.rows, args.steps = [1, 8], 8
    torch.set_num_threads(args.threads)
    kernel = fused_kernels()
    if kernel is None:
        raise SystemExit("the fused kernels are not built (make setup)")
    forms = {}
    for form, model_id in FORMS.items():
        forms[form] = form_steps(model_id, args.rows, args.steps, args.fused_only)
        log(f"{form}: {forms[form]}")
    if args.fused_only:
        print(json.dumps(forms))
        return
    result = {"bench": "steps", "machine": machine_info(), "roofline": measure_roofline(),
              "model": MODEL, "threads": args.threads, "steps": args.steps,
              "amx_tiles": bool(kernel.amx), "forms": forms}
    if kernel.amx:
        result["without_tiles"] = without_tiles(args)
    write_results("steps", result, render(result))


if __name__ == "__main__":
    main()
