"""Serving SmolLM2 from Unweight-resident weights vs dense BF16: memory and decode speed.

Both models load in one process and are timed in alternation (median of rounds), each at
1, 8 and 32 concurrent greedy streams (prompts of 32 tokens, 128 new tokens each), and on
prefill alone (8 prompts of 256 tokens). Part of
bench/codec.py's report; runs alone with `python -m bench.resident`.
"""

from __future__ import annotations

import dataclasses
import statistics

from bench._common import log, make_prompts, prompt_lengths, stopwatch
from edgefire.contract.catalog import Catalog
from edgefire.runtime import LLM, EngineConfig, SamplingParams

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
CONCURRENCY = (1, 8, 32)
NEW_TOKENS = 128
ROUNDS = 3


def _decode_rate(llm: LLM, n: int, tag: str) -> float:
    """Output tokens per second of the decode phase: the time of a prefill-only run over
    same-length prompts is taken out. Every run has prompts of its own (a unique header), so
    the prefix cache serves none of them."""
    encode = llm.tokenizer.encode
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    lengths = prompt_lengths(n, 32, 32, seed=n)
    with stopwatch() as prefill:
        llm.generate(make_prompts(encode, lengths, seed=n, tag=f"{tag}-prefill"), one)
    with stopwatch() as total:
        llm.generate(make_prompts(encode, lengths, seed=n, tag=tag), params)
    return n * (NEW_TOKENS - 1) / (total[0] - prefill[0])


def _prefill_rate(llm: LLM, tag: str) -> float:
    """Prompt tokens per second: 8 prompts of 256 tokens, one output token each."""
    lengths = [256] * 8
    prompts = make_prompts(llm.tokenizer.encode, lengths, seed=0, tag=tag)
    with stopwatch() as elapsed:
        llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    return sum(lengths) / elapsed[0]


def measure() -> dict:
    spec = Catalog.load().get(MODEL)
    # Drafts off: this compares the weight forms' decode steps, not n-gram luck.
    llms = {codec: LLM(MODEL, catalog=Catalog([dataclasses.replace(spec, codec=codec)]),
                       engine_config=EngineConfig(speculative="off"))
            for codec in ("identity", "unweight")}
    models = {codec: llm.model for codec, llm in llms.items()}
    rates: dict[str, dict[int, list[float]]] = {c: {n: [] for n in CONCURRENCY} for c in llms}
    for n in CONCURRENCY:
        for round_ in range(ROUNDS):
            for codec, llm in llms.items():
                rates[codec][n].append(_decode_rate(llm, n, f"{codec}-{round_}"))
            log(f"resident C={n} round {round_}: " + ", ".join(
                f"{c} {rates[c][n][-1]:.1f} tok/s" for c in llms))
    prefill = {c: round(statistics.median(_prefill_rate(llm, f"{c}-prefill-{i}")
                                           for i in range(ROUNDS)), 1)
               for c, llm in llms.items()}
    check = make_prompts(llms["identity"].tokenizer.encode, [24, 40], seed=7, tag="check")
    greedy = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    same = [a.token_ids == b.token_ids for a, b in zip(
        llms["identity"].generate(check, greedy), llms["unweight"].generate(check, greedy),
        strict=True)]
    dense, packed = models["identity"].weight_bytes, models["unweight"].weight_bytes
    tok_s = {c: {n: round(statistics.median(r), 1) for n, r in per.items()}
             for c, per in rates.items()}
    cost = {n: round(1 - tok_s["unweight"][n] / tok_s["identity"][n], 3) for n in CONCURRENCY}
    return {
        "weight_bytes": {"bf16": dense, "unweight_resident": packed},
        "memory_reduction": round(1 - packed / dense, 4),
        "weight_precision": models["unweight"].weight_precision,
        "decode_tok_s": {c: {str(n): v for n, v in per.items()} for c, per in tok_s.items()},
        "decode_cost": {str(n): v for n, v in cost.items()},
        "prefill_tok_s": prefill,
        "greedy_64_tokens_identical": same,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(measure()))
