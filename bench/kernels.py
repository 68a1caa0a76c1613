"""Decode-step kernels against the machine's roofline: GB/s per SmolLM2 weight shape for the
native BF16 matmul (models/fused/gemv.h) and torch's (oneDNN), a whole decode step fused
vs through torch, and the host's share of a single-stream engine step.

Run from the repository root: .venv/bin/python -m bench.kernels [--quick]
Output as every bench writes it (bench/_common.py): progress on stderr, one JSON object last
on stdout, the same and a table in bench/results/kernels.{json,md}.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench._common import log, machine_info, markdown_table, write_results
from bench.roofline import measure_roofline
from edgefire.models.fused import fused_kernels, weight_form
from edgefire.models.fused.llama_decode import pack_pairs
from edgefire.plugins.quant.linear import HAS_INT4_KERNEL, Int4Linear, Int8Linear
from edgefire.runtime import LLM, EngineConfig, SamplingParams
from edgefire.runtime.engine.precision import Precision

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
# SmolLM2-135M's projections [out, in].
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "lm_head": (49152, 576)}
# Each shape is held in copies totalling more than this machine's L3 (480 MiB), cycled
# through, so every call reads its weight from memory: no copy is still cached when it comes
# round again. (A whole SmolLM2 step reads 270 MB, which partly stays in such an L3 between
# steps: the step figures below include that effect, these do not.)
STREAM_BYTES = 640 << 20


def best_seconds(fn: Callable[[], object], reps: int) -> float:
    """Best mean over three runs of reps calls (after one warm-up call)."""
    fn()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        runs.append((time.perf_counter() - start) / reps)
    return min(runs)


def _forms(w: torch.Tensor, isa: str) -> dict[str, tuple[list, Callable]]:
    """Per weight form: the tensors the fused step reads, and a function that makes torch's
    own matmul for the same form over a copy of them (BF16: the faster of oneDNN's BF16 and
    torch's float32 matmul, which on AVX2-only CPUs is the one that is fast; torch's INT8 and
    INT4 weight-only kernels, as the quant plugin uses). With AVX-512, "bf16_pairs": the BF16
    weight packed as pairs, which the fused step multiplies there (gemm_packed.h), against
    oneDNN's BF16 over the unpacked weight (without BF16 dot products, torch's float32 matmul:
    the fast one there); and "int8_pairs": the INT8 weight packed so (gemm_packed_int8.h),
    which the step takes from kInt8PackedFromRows rows, against torch's INT8 kernel. A pairs
    form's tensors are its packing, then the form it packs."""
    int8 = Int8Linear.quantize(w)
    bf16 = w.bfloat16()
    forms = {"bf16": ([bf16], lambda t: lambda x: F.linear(x, t[0])),
             "bf16_vs_torch_float32": ([bf16], _float32_peer),
             "int8": (weight_form(int8), lambda t: Int8Linear(t[0], t[1]).linear)}
    if isa in ("avx512bf16", "avx512"):
        peer = ((lambda t: lambda x: F.linear(x, t[1])) if isa == "avx512bf16"
                else (lambda t: _float32_peer(t[1:])))
        forms["bf16_pairs"] = ([pack_pairs([bf16]), bf16], peer)
        int8_form = weight_form(int8)
        forms["int8_pairs"] = ([pack_pairs(int8_form), *int8_form],
                               lambda t: Int8Linear(t[1], t[2]).linear)
    if HAS_INT4_KERNEL:  # both read torch's INT4 packing
        int4 = Int4Linear.quantize(w, 32)
        forms["int4"] = (weight_form(int4), lambda t: Int4Linear(t[0], t[1], 32).linear)
    return forms


def _float32_peer(tensors: list) -> Callable[[torch.Tensor], torch.Tensor]:
    fp32 = tensors[0].float()
    return lambda x: F.linear(x.float(), fp32)


def shape_rates(rows_list: list[int], reps: int) -> dict[str, dict]:
    """GB/s of weight read per shape, form and row count, streamed from memory (STREAM_BYTES
    of copies; bytes counted as each form holds them, scales included)."""
    kernel = fused_kernels()
    out: dict[str, dict] = {}
    for name, (n, k) in SHAPES.items():
        out[name] = {"shape": [n, k], "forms": {}}
        for form, (tensors, make_peer) in _forms(torch.randn(n, k) * 0.05, kernel.isa).items():
            pairs = form.endswith("_pairs")
            matmul = (lambda x, c: kernel.linear(x, c[1:], c[0])) if pairs else kernel.linear
            # the bytes the fused step reads: an INT4 form also names its packing's rows per
            # block (an int), and a pairs form carries the unpacked weight for the kernel's
            # checks and torch's peer (its scales are read)
            read = [tensors[0], *tensors[2:]] if pairs else tensors
            nbytes = sum(x.nbytes for x in read if isinstance(x, torch.Tensor))
            copies = -(-STREAM_BYTES // nbytes)
            native_copies = [[x.clone() if isinstance(x, torch.Tensor) else x for x in tensors]
                             for _ in range(copies)]
            # torch's matmul over each copy in turn: its weight streams from memory as the
            # native kernel's does ("torch GB/s" counts the fused form's bytes, so the columns
            # compare times)
            peers = [make_peer(c) for c in native_copies]
            # the same matmuls in one native call, as the fused step runs them: no Python call
            # and no input copy per matmul (the pairs form: its packing, over the BF16 form)
            forms = [c[1:] for c in native_copies] if pairs else native_copies
            packed = [c[0] for c in native_copies] if pairs else []
            per_rows = {}
            for rows in rows_list:
                x = torch.randn(rows, k).bfloat16()
                native = best_seconds(
                    lambda x=x, cs=native_copies, f=matmul: [f(x, c) for c in cs], reps)
                looped = min(kernel.time_linears(x, forms, packed) for _ in range(1 + reps))
                dense = best_seconds(lambda x=x, ps=peers: [p(x) for p in ps], reps)
                per_rows[str(rows)] = {"native_gb_s": round(copies * nbytes / native / 1e9, 2),
                                       "one_call_gb_s": round(copies * nbytes / looped / 1e9, 2),
                                       "torch_gb_s": round(copies * nbytes / dense / 1e9, 2),
                                       "native_vs_torch": round(dense / native, 3)}
            out[name]["forms"][form] = {"bytes": nbytes, "copies": copies, "per_rows": per_rows}
            log(f"{name} {n}x{k} {form}: " + ", ".join(
                f"M={r} {v['native_gb_s']} (one call {v['one_call_gb_s']}) vs "
                f"{v['torch_gb_s']} GB/s" for r, v in per_rows.items()))
            del native_copies, peers
    return out


def step_times(llm: LLM, rows_list: list[int], steps: int) -> dict[str, dict]:
    """ms per decode step of `rows` sequences, fused and through torch (in BF16, and in
    float32 where the model holds it: AVX2-only CPUs), timing the engine's runner (forward and
    logits) apart from the rest of the step (scheduling, metadata, sampling, detokenizing):
    the host's overhead per step."""
    engine = llm.engine
    runner = engine.runner
    inner = runner.execute
    spent: list[float] = []

    def timed(batch):
        start = time.perf_counter()
        result = inner(batch)
        spent.append(time.perf_counter() - start)
        return result

    runner.execute = timed
    prompt = llm.tokenizer.encode("The history of Frankfurt am Main " * 40)[:256]
    out: dict[str, dict] = {}
    precision = runner.precision
    paths = [("fused", True, precision), ("torch", False, precision)]
    if torch.float32 in precision.dtypes:
        paths.append(("torch_float32", False, Precision.parse("float32")))
    try:
        for path, fused, runner.precision in paths:
            llm.model.fused_decode = fused
            for rows in rows_list:
                params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
                for i in range(rows):  # distinct prompts: the prefix cache must not join them
                    engine.add_request(f"k{path}{rows}-{i}", [i + 1, *prompt], params)
                while any(s.num_computed_tokens < s.num_prompt_tokens
                          for s in [*engine.scheduler.waiting, *engine.scheduler.running]):
                    engine.step()
                spent.clear()
                start = time.perf_counter()
                count = 0
                while engine.has_unfinished():
                    engine.step()
                    count += 1
                wall = (time.perf_counter() - start) / count
                model = sum(spent) / len(spent)
                key = f"{path}_{rows}"
                out[key] = {"path": path, "fused": fused, "rows": rows,
                            "step_ms": round(wall * 1e3, 3),
                            "model_ms": round(model * 1e3, 3),
                            "host_overhead_us": round((wall - model) * 1e6, 1),
                            "tok_s": round(rows / wall, 1)}
                log(f"{key}: {out[key]}")
    finally:
        runner.execute, runner.precision = inner, precision
        llm.model.fused_decode = True
    return out


def render(result: dict) -> str:
    bw = result["roofline"]["read_gb_s"]
    rows = []
    for name, shape in result["shapes"].items():
        for form, entry in shape["forms"].items():
            n, k = shape["shape"]
            for r, v in entry["per_rows"].items():
                # each weight element is multiplied into every row: 2 * rows * n * k flops
                gflop_s = v["native_gb_s"] / entry["bytes"] * 2 * int(r) * n * k
                rows.append([name, "x".join(map(str, shape["shape"])), form, r,
                             v["native_gb_s"], f"{v['native_gb_s'] / bw:.0%}", round(gflop_s, 1),
                             v["one_call_gb_s"], f"{v['one_call_gb_s'] / bw:.0%}",
                             v["torch_gb_s"], v["native_vs_torch"]])
    shapes = markdown_table(["weight", "shape", "form", "rows", "native GB/s", "of read bw",
                             "native GFLOP/s", "one call GB/s", "of read bw", "torch GB/s",
                             "native/torch"], rows)
    weight_mb = result["weight_bytes"] / 1e6
    steps = markdown_table(
        ["path", "rows", "step ms", "model ms", "host overhead us", "tok/s", "weights GB/s"],
        [[s["path"], s["rows"], s["step_ms"], s["model_ms"],
          s["host_overhead_us"], s["tok_s"], round(weight_mb / s["model_ms"], 1)]
         for s in result["steps"].values()])
    return (f"# Decode kernels (SmolLM2-135M shapes)\n\nMachine: measured read bandwidth "
            f"{bw} GB/s, {result['roofline']['gemm_dtype']} GEMM "
            f"{result['roofline']['gemm_tflop_s']} TFLOP/s. "
            f"torch: oneDNN BF16 matmul, torch's INT8/INT4 weight-only kernels; weights "
            f"streamed from memory. \"native\": one Python call per matmul; \"one call\": "
            f"the same matmuls run back to back in one native call, as the fused step runs "
            f"them.\n\n{shapes}\n## BF16 decode step (SmolLM2, weights "
            f"{weight_mb:.0f} MB)\n\n{steps}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if fused_kernels() is None:
        raise SystemExit("the fused kernels are not built (make setup)")
    roofline = measure_roofline()
    log(f"roofline: {roofline}")
    rows_list = [1, 4] if args.quick else [1, 2, 4, 8, 16, 32, 64]
    shapes = shape_rates(rows_list, 3 if args.quick else 10)
    # Drafts off: each step here is exactly `rows` decode rows (bench/engine.py measures them on).
    # "auto" holds BF16 (the fused step's) and, where its batched steps use it, float32 too.
    llm = LLM(MODEL, engine_config=EngineConfig(dtype="auto", speculative="off"))
    rows = [1, 4] if args.quick else [1, 4, 8, 16, 32, 64]
    steps = step_times(llm, rows, 16 if args.quick else 64)
    result = {"bench": "kernels", "machine": machine_info(), "roofline": roofline,
              "model": MODEL, "weight_bytes": llm.model.weight_bytes, "shapes": shapes,
              "steps": steps}
    write_results("kernels", result, render(result))


if __name__ == "__main__":
    main()
