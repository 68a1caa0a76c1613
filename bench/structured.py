"""Structured output's cost: decode tok/s with and without a JSON Schema constraint.

SmolLM2-135M through the engine, C=1 and C=32 requests of the same chat prompt, 128 new tokens
each. Free requests run to max_tokens (ignore_eos); constrained ones are held to a schema long
enough that they do too (an array of 8 people), so both decode the same number of steps.
Decode tok/s counts the tokens after each request's first, over the time after the prefill
step. Also measured: one mask's cost (llguidance's bitmask, unpacked to the vocabulary and
applied to a row of logits, as the sampler does) and its share of a decode step at C=32; the
target is < 10%.

Run from the repository root: .venv/bin/python -m bench.structured [--tokens 128]
Output as every bench writes it (bench/_common.py): progress on stderr, one JSON object last
on stdout, the same and a table in bench/results/structured.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from bench._common import log, machine_info, markdown_table, rate, ratio, write_results
from edgefire.runtime import LLM, SamplingParams

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
PROMPT = [{"role": "user", "content": "List eight people as JSON with name and age."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
PEOPLE = {"type": "array", "items": PERSON, "minItems": 8, "maxItems": 8}


def decode_rate(llm: LLM, prompt: list[int], params: SamplingParams, concurrency: int) -> dict:
    engine = llm.engine
    for i in range(concurrency):
        engine.add_request(f"r{i}", prompt, replace(params, seed=i))
    step_times, tokens = [], 0
    first = True
    while engine.has_unfinished():
        start = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - start
        if first:  # the prefill step makes every request's first token
            first = False
            continue
        step_times.append(elapsed)
        tokens += len(outputs)
    return {"decode_tok_s": rate(tokens, sum(step_times)), "decode_tokens": tokens,
            "median_step_ms": round(1000 * statistics.median(step_times), 2)}


def mask_cost_us(llm: LLM, repeats: int = 200) -> float:
    """One constrained row's mask as the sampler makes and applies it (Sampler.__call__)."""
    constraint = llm.engine.grammars.json_schema(PEOPLE, "bench")
    with torch.inference_mode():  # the model's logits are inference tensors
        logits = torch.zeros(llm.engine.vocab_size)
    start = time.perf_counter()
    with torch.inference_mode():
        for _ in range(repeats):
            logits.masked_fill_(constraint.banned(), float("-inf"))
    return round(1e6 * (time.perf_counter() - start) / repeats, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    llm = LLM(SMOL)
    prompt = llm.tokenizer.encode(llm.tokenizer.chat_template.render(PROMPT),
                                  add_special_tokens=False)
    free = SamplingParams(max_tokens=args.tokens, temperature=0.8, ignore_eos=True)
    constrained = replace(free, ignore_eos=False, json_schema=PEOPLE)
    decode_rate(llm, prompt, free, 2)  # warm-up: kernels, allocator
    rows, result = [], {"model": SMOL, "new_tokens": args.tokens, "machine": machine_info()}
    for concurrency in (1, 32):
        log(f"C={concurrency}")
        plain = decode_rate(llm, prompt, free, concurrency)
        held = decode_rate(llm, prompt, constrained, concurrency)
        slowdown = ratio(plain["decode_tok_s"], held["decode_tok_s"])
        result[f"c{concurrency}"] = {"free": plain, "json_schema": held,
                                     "free_over_constrained": slowdown}
        rows.append([concurrency, plain["decode_tok_s"], held["decode_tok_s"], slowdown,
                     plain["median_step_ms"], held["median_step_ms"]])
    mask_us = mask_cost_us(llm)
    step_ms = result["c32"]["free"]["median_step_ms"]
    result["mask_us"] = mask_us
    result["mask_share_of_c32_step"] = round(32 * mask_us / 1000 / step_ms, 4)
    result["target_mask_share"] = 0.10
    table = markdown_table(["C", "free tok/s", "json_schema tok/s", "free / constrained",
                            "free step ms", "constrained step ms"], rows)
    table += (f"\nOne mask: {mask_us} µs; 32 of them are "
              f"{100 * result['mask_share_of_c32_step']:.1f}% of a C=32 decode step "
              f"(target < 10%).\n")
    write_results("structured", result, table)


if __name__ == "__main__":
    main()
