"""Decode attention over the paged cache: how fast the native kernel reads K/V, from where.

One query token per sequence over a bfloat16 pool in SmolLM2-135M's shape (30 layers, 9 query
heads, 3 KV heads of 64, 16-token blocks), the pool as large as the engine bench's (3 GiB), so
that a step's pages stream from memory as they do in a step at C=64 in lockstep: 64 sequences
of 334 tokens (the bench's 270-token prompts plus half of 128 new tokens), every layer's pages
read once a step. The same step with its blocks in order, in the order the engine hands them
out (each prompt's blocks together, the decodes' new blocks interleaved), in random order, and
on one thread (is it a core's rate or the machine's that holds it?); then with the pages of
one layer read again each call (from the L3) and with 8 sequences of one layer (from the L2).
Beside each, torch's path (TorchPagedAttention without the kernel: gather the pages, then
SDPA). GB/s counts the K/V bytes a step must read, against the read rate measured beside them.

Run from the repository root: .venv/bin/python -m bench.decode_attention
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench._common import log, machine_info, markdown_table, write_results
from bench.roofline import measure_roofline
from edgefire.models.attention import TorchPagedAttention
from edgefire.models.attention.metadata import AttentionMetadata

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16
POOL_BYTES = 3 << 30  # bench/engine.py's kv_cache_bytes
PROMPT, CONTEXT = 270, 270 + 64
ROUNDS = 5


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    seqs: int
    order: str  # in order | engine | random
    layers: int  # distinct layers' pages a step reads (1: the same layer's each call)
    threads: int = 2


CASES = [Case("memory, blocks in order", 64, "in order", LAYERS),
         Case("memory, blocks as the engine hands them out", 64, "engine", LAYERS),
         Case("memory, blocks in random order", 64, "random", LAYERS),
         Case("memory, as the engine hands them out, one thread", 64, "engine", LAYERS, 1),
         Case("L3: one layer's pages, read again", 64, "engine", 1),
         Case("L2: 8 sequences of one layer", 8, "engine", 1)]


def block_tables(order: str, seqs: int, num_blocks: int, g: torch.Generator) -> torch.Tensor:
    """[seqs, blocks per sequence] block ids, each block in one sequence only."""
    per_seq = -(-CONTEXT // BLOCK)
    if order == "random":
        return torch.randperm(num_blocks, generator=g)[:seqs * per_seq].view(seqs, per_seq)
    if order == "in order":
        return torch.arange(seqs * per_seq).view(seqs, per_seq)
    # The engine: the prompts' blocks as they were admitted, then each decode block taken by
    # every sequence in the same step.
    prompt = -(-PROMPT // BLOCK)
    first = torch.arange(seqs * prompt).view(seqs, prompt)
    later = seqs * prompt + torch.arange(seqs * (per_seq - prompt)).view(per_seq - prompt, seqs)
    return torch.cat([first, later.T], dim=1)


def _mean_ms(fn: Callable[[], None], calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def run_case(case: Case, pool: torch.Tensor, g: torch.Generator) -> dict:
    tables = block_tables(case.order, case.seqs, pool.shape[3], g)
    lens = torch.full((case.seqs,), CONTEXT, dtype=torch.long)
    width = tables.shape[1] * BLOCK
    mask = (torch.arange(width)[None, :] < lens[:, None])[None, :, None, :]
    meta = AttentionMetadata(torch.zeros(0, dtype=torch.long), case.seqs, tables, lens, mask, [])
    q = torch.randn(case.seqs, HEADS, HEAD_DIM, generator=g).bfloat16()
    paths = {name: TorchPagedAttention(HEADS, KV_HEADS, HEAD_DIM, native=native)
             for name, native in (("native", True), ("torch", False))}
    if paths["native"].kernel is None:
        raise SystemExit("the native decode kernel is not built here (no compiler or SIMD)")

    def step(backend: TorchPagedAttention) -> Callable[[], None]:
        def run() -> None:  # every layer a step reads, one call each
            for layer in range(LAYERS):
                kv = pool[layer % case.layers]
                backend._decode(q, kv[0], kv[1], meta)
        return run

    times: dict[str, list[float]] = {name: [] for name in paths}
    torch.set_num_threads(case.threads)
    for _ in range(ROUNDS):
        for name, backend in paths.items():
            times[name].append(_mean_ms(step(backend), 2))
    torch.set_num_threads(2)
    ms = {name: statistics.median(t) for name, t in times.items()}
    kv_bytes = LAYERS * case.seqs * CONTEXT * KV_HEADS * HEAD_DIM * 2 * pool.element_size()
    return {"case": case.name, "seqs": case.seqs, "context": CONTEXT, "block_order": case.order,
            "distinct_layers": case.layers, "threads": case.threads,
            "kv_mb": round(kv_bytes / 1e6, 1),
            "native_ms": round(ms["native"], 2), "torch_ms": round(ms["torch"], 2),
            "native_gb_s": round(kv_bytes / ms["native"] / 1e6, 1),
            "torch_gb_s": round(kv_bytes / ms["torch"] / 1e6, 1),
            "speedup": round(ms["torch"] / ms["native"], 3)}


def main() -> None:
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    num_blocks = POOL_BYTES // (LAYERS * 2 * KV_HEADS * BLOCK * HEAD_DIM * 2)
    pool = torch.randn(LAYERS, 2, KV_HEADS, num_blocks, BLOCK, HEAD_DIM,
                       generator=g).bfloat16()
    rows = []
    for case in CASES:
        rows.append(run_case(case, pool, g))
        log(f"decode attention, {case.name}: {rows[-1]}")
    del pool
    roofline = measure_roofline()
    read = roofline.get("read_gb_s")
    for row in rows:
        row["native_of_read_rate"] = round(row["native_gb_s"] / read, 3) if read else None
    result = {"bench": "decode_attention",
              "shape": {"layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
                        "head_dim": HEAD_DIM, "block_size": BLOCK, "dtype": "bfloat16",
                        "pool_bytes": POOL_BYTES},
              "threads": "2 unless a case says", "rounds": ROUNDS, "machine": machine_info(),
              "roofline": roofline, "cases": rows}
    markdown = f"Read rate measured beside it (2 threads): {read} GB/s.\n\n" + markdown_table(
        ["case", "K/V MB a step", "native ms", "native GB/s", "of the read rate", "torch ms",
         "torch GB/s", "native speed-up"],
        [[r["case"], r["kv_mb"], r["native_ms"], r["native_gb_s"], r["native_of_read_rate"],
          r["torch_ms"], r["torch_gb_s"], r["speedup"]] for r in rows])
    write_results("decode_attention", result, markdown)


if __name__ == "__main__":
    main()
