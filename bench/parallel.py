"""Parallel layouts: SmolLM2-135M in one process against tensor and pipeline parallel over two
(Gloo), and the Kimi K2.5 miniature in one process against expert parallel over two.

SmolLM2's rows, each on the machine's two cores: tp=1 as a node runs it (its fused native
decode step), tp=1 through torch's layers (the path every rank of a layout runs: the fused
step has no collectives between layers), tp=2 and pp=2 with each rank pinned to its own core
(EDGEFIRE_PARALLEL_PIN=1), and pp=2×tp=2, whose four ranks share the two cores (two pinned
to each). For each: prefill tok/s (8 prompts of 256 tokens, one new token
each) and decode tok/s at C=1 and C=8 (prompts of 64 tokens, 64 new tokens each, greedy,
drafts off, the steps after every request's first token); for the layouts, the root rank's
time in collectives per decode step and per token: tp=2's two all-reduces a layer, the
embedding's and the logits' gather; pp=2's sends and receives, where the root's waiting on
the other stage is the pipeline's bubble as the root sees it; pp=2×tp=2's both. On two CPU
cores no layout pays: the aim is their honest overhead. The Kimi miniature's rows (ep=1, ep=2) are
the same measures; ep=2's collectives are each MoE block's count exchange, two all-to-alls
and all-gather.

Run from the repository root: .venv/bin/python -m bench.parallel
Output as every bench writes it (bench/_common.py): progress on stderr, one JSON object last
on stdout, the same and a table in bench/results/parallel.{json,md}.
"""

from __future__ import annotations

import os

os.environ["EDGEFIRE_PARALLEL_PIN"] = "1"  # read when the layouts' code is first imported

import time  # noqa: E402
from dataclasses import replace  # noqa: E402

import torch  # noqa: E402

from bench._common import (  # noqa: E402
    log,
    machine_info,
    make_prompts,
    markdown_table,
    rate,
    write_results,
)
from bench.roofline import measure_roofline  # noqa: E402
from edgefire.contract.catalog import Catalog  # noqa: E402
from edgefire.runtime import LLM, EngineConfig, SamplingParams  # noqa: E402
from edgefire.runtime.parallel.root import ParallelLM  # noqa: E402

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
MOE = "@cf/moonshotai/kimi-k2.5"
PREFILL = (8, 256)  # prompts, tokens each
DECODE_PROMPT, NEW_TOKENS = 64, 64


# (model, row name, layout): each served under its own id (_layout_id).
LAYOUTS = [(MODEL, "tp=2", {"tp": 2}), (MODEL, "pp=2", {"pp": 2}),
           (MODEL, "pp=2×tp=2", {"pp": 2, "tp": 2}), (MOE, "ep=2", {"ep": 2})]


def _layout_id(model: str, raw: dict[str, int]) -> str:
    return model + "-" + "".join(f"{axis}{degree}" for axis, degree in raw.items())


def _catalog() -> Catalog:
    catalog = Catalog.load()
    return Catalog([*catalog.specs, *(
        replace(spec, id=_layout_id(model, raw), aliases=(),
                extra={**spec.extra, "parallel": raw})
        for model, _, raw in LAYOUTS for spec in [catalog.get_runnable(model)])])


def _drive(llm: LLM, prompts: list[list[int]], max_tokens: int) -> dict:
    """All prompts at once; the wall time, and once every request has its first token
    (llama-batched-bench's S_TG) the decode tokens, steps, seconds and collectives."""
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    firsts: dict[str, float] = {}
    after, steps_after = 0, 0
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"p{i}-{time.monotonic_ns()}", prompt, params)
    decode_start = None
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        if decode_start is not None:
            after += sum(len(o.token_ids) for o in outputs)
            steps_after += 1
        for o in outputs:
            firsts.setdefault(o.request_id, now)
        if decode_start is None and len(firsts) == len(prompts):
            decode_start = now
            at_start = _collectives(llm)
    end = time.perf_counter()
    spent, calls = ((now - was for now, was in zip(_collectives(llm), at_start, strict=True))
                    if decode_start is not None else (0.0, 0))
    return {"wall_s": end - start, "decode_tokens": after, "decode_steps": steps_after,
            "decode_s": end - (decode_start or end), "collective_s": spent,
            "collective_calls": calls}


def _collectives(llm: LLM) -> tuple[float, int]:
    model = llm.engine.runner.model
    if not isinstance(model, ParallelLM):
        return 0.0, 0
    return model.comm.tally.seconds, model.comm.tally.calls


def _measure(llm: LLM, name: str, model: str = MODEL) -> dict:
    encode = llm.tokenizer.encode
    _drive(llm, make_prompts(encode, [64, 32], 9, f"warm-{name}"), 4)
    prefill = make_prompts(encode, [PREFILL[1]] * PREFILL[0], 1, f"pf-{name}")
    run = _drive(llm, prefill, 1)
    row: dict = {"model": model, "layout": name,
                 "prefill_tok_s": rate(PREFILL[0] * PREFILL[1], run["wall_s"])}
    for c in (1, 8):
        run = _drive(llm, make_prompts(encode, [DECODE_PROMPT] * c, 2 + c, f"d{c}-{name}"),
                     NEW_TOKENS)
        row[f"c{c}_decode_tok_s"] = rate(run["decode_tokens"], run["decode_s"])
        row[f"c{c}_step_ms"] = round(run["decode_s"] / run["decode_steps"] * 1e3, 3)
        if run["collective_calls"]:  # the decode phase's, on the root rank
            spent, calls, steps = (run["collective_s"], run["collective_calls"],
                                   run["decode_steps"])
            row[f"c{c}_collectives"] = {
                "calls_per_step": round(calls / steps, 1),
                "us_per_call": round(spent / calls * 1e6, 1),
                "us_per_step": round(spent / steps * 1e6, 1),
                "us_per_token": round(spent / run["decode_tokens"] * 1e6, 1),
                "share_of_decode": round(spent / run["decode_s"], 3)}
        log(f"{name} C={c}: {row}")
    return row


def main() -> None:
    # Measured first: the layouts pin this process to one core for good.
    roofline = measure_roofline()
    catalog = _catalog()
    config = EngineConfig(kv_cache_bytes=512 << 20, speculative="off")
    rows = []
    # One process first, on both cores: a layout pins this process to one core for good.
    torch.set_num_threads(2)
    llm = LLM(MODEL, engine_config=config, catalog=catalog)
    rows.append(_measure(llm, "tp=1 (fused step)"))
    llm.model.fused_decode = False
    rows.append(_measure(llm, "tp=1 (torch layers)"))
    llm.engine.close()
    llm = LLM(MOE, engine_config=config, catalog=catalog)
    rows.append(_measure(llm, "ep=1", MOE))
    llm.engine.close()
    for model, name, raw in LAYOUTS:
        llm = LLM(_layout_id(model, raw), engine_config=config, catalog=catalog)
        rows.append(_measure(llm, name, model))
        stage = getattr(llm.engine.runner.model.shard, "stage", None)
        if stage is not None:  # the balancer's cut: the first stage's layers, the rest after
            rows[-1]["root_layers"] = stage.config.num_layers
        llm.engine.close()
    result = {"bench": "parallel", "models": [MODEL, MOE], "machine": machine_info(),
              "workload": {"prefill": {"prompts": PREFILL[0], "tokens": PREFILL[1]},
                           "decode": {"prompt_tokens": DECODE_PROMPT,
                                      "new_tokens": NEW_TOKENS, "concurrency": [1, 8]}},
              "backend": "gloo", "pinned": True, "rows": rows, "roofline": roofline}
    markdown = markdown_table(
        ["model", "layout", "prefill tok/s", "C=1 decode tok/s", "C=8 decode tok/s",
         "C=1 collectives µs/step", "C=1 share of decode", "C=8 collectives µs/token",
         "collectives µs/call (C=1)"],
        [[r["model"].split("/")[-1], r["layout"], r["prefill_tok_s"], r["c1_decode_tok_s"],
          r["c8_decode_tok_s"],
          r.get("c1_collectives", {}).get("us_per_step"),
          r.get("c1_collectives", {}).get("share_of_decode"),
          r.get("c8_collectives", {}).get("us_per_token"),
          r.get("c1_collectives", {}).get("us_per_call")] for r in rows])
    write_results("parallel", result, markdown)


if __name__ == "__main__":
    main()
