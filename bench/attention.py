"""Prefill attention over the paged cache: the native causal kernel against torch's SDPA.

Both read the same pages of a bfloat16 cache in SmolLM2-135M's shape (9 query heads, 3 KV
heads of 64) for one prompt chunk, as TorchPagedAttention runs them: SDPA over the gathered
pages (is_causal for a whole prompt, the causal mask for a later chunk), the native kernel
(models/attention/cpu_paged_prefill.cpp) on the pages in place. Each case is timed in
alternation, median of rounds; GFLOP/s counts the causal work only (4 * d per query-key pair
at or before the query, per head), which SDPA computes in full before masking.

Run from the repository root: .venv/bin/python -m bench.attention
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from bench._common import log, machine_info, markdown_table, write_results
from edgefire.models.attention import TorchPagedAttention

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
# (chunk, context): whole prompts of the engine bench's range, and a later 256-token chunk
CASES = [(64, 64), (128, 128), (270, 270), (512, 512), (1024, 1024), (256, 768)]
ROUNDS, CALLS = 7, 10


def _case(chunk: int, context: int, native: bool,
          g: torch.Generator) -> Callable[[], torch.Tensor]:
    blocks = -(-context // BLOCK) + 8
    cache = torch.randn(2, KV_HEADS, blocks, BLOCK, HEAD_DIM, generator=g).bfloat16()
    table = torch.randperm(blocks, generator=g)[:-(-context // BLOCK)]
    q = torch.randn(chunk, HEADS, HEAD_DIM, generator=g).bfloat16()
    mask = None
    if chunk < context:
        mask = torch.arange(context)[None, :] <= torch.arange(context - chunk, context)[:, None]
    backend = TorchPagedAttention(HEADS, KV_HEADS, HEAD_DIM, native=native, native_prefill=native)
    k_cache, v_cache = cache[0], cache[1]
    if not native:  # the backend's SDPA path: gather the pages, then attend
        return lambda: backend._prefill(q, k_cache, v_cache, table, context, mask)
    kernel = backend.prefill_kernel
    if kernel is None:
        raise SystemExit("the native prefill kernel is not built here (no compiler or SIMD)")
    # the backend's native branch, as its forward runs it for a causal span
    return lambda: kernel.paged_prefill(q.float(), k_cache, v_cache, table, context,
                                        backend.scale).view(chunk, -1).to(q.dtype)


def _time(fn: Callable[[], torch.Tensor]) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - start) / CALLS * 1e3


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    for chunk, context in CASES:
        # the same cache and queries for both
        fns = {name: _case(chunk, context, native, torch.Generator().manual_seed(chunk + context))
               for name, native in (("sdpa", False), ("native", True))}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                times[name].append(_time(fn))
        ms = {name: round(statistics.median(t), 3) for name, t in times.items()}
        # query i (position context - chunk + i) sees context - chunk + i + 1 keys
        pairs = sum(context - chunk + i + 1 for i in range(chunk))
        flop = 4 * HEAD_DIM * HEADS * pairs
        rows.append({"chunk": chunk, "context": context, "sdpa_ms": ms["sdpa"],
                     "native_ms": ms["native"],
                     "sdpa_gflop_s": round(flop / ms["sdpa"] / 1e6, 1),
                     "native_gflop_s": round(flop / ms["native"] / 1e6, 1),
                     "speedup": round(ms["sdpa"] / ms["native"], 3)})
        log(f"attention {chunk}/{context}: {rows[-1]}")
    result = {"bench": "attention", "shape": {"heads": HEADS, "kv_heads": KV_HEADS,
                                              "head_dim": HEAD_DIM, "block_size": BLOCK,
                                              "dtype": "bfloat16"},
              # what TorchPagedAttention runs prompts with on this CPU when not told
              "default_prompt_path": ("native" if TorchPagedAttention(
                  HEADS, KV_HEADS, HEAD_DIM).prefill_kernel is not None else "sdpa"),
              "threads": 2, "rounds": ROUNDS, "calls_per_round": CALLS,
              "machine": machine_info(), "cases": rows}
    markdown = markdown_table(
        ["chunk", "context", "SDPA ms", "native ms", "SDPA GFLOP/s", "native GFLOP/s",
         "native speed-up"],
        [[r["chunk"], r["context"], r["sdpa_ms"], r["native_ms"], r["sdpa_gflop_s"],
          r["native_gflop_s"], r["speedup"]] for r in rows])
    write_results("attention", result, markdown)


if __name__ == "__main__":
    main()
