"""Weight-only quantization on SmolLM2-135M: BF16 vs INT8 vs INT4, in one run.

Per precision: perplexity on tests/data/perplexity.txt, resident weight bytes (projections and
the rest), and greedy decode tok/s through engine steps at batch 1 and 32 (64 new tokens).
Also the cost of the dense path's new dispatch helper. `python -m bench.quant`.
"""

from __future__ import annotations

import gc
import timeit
from pathlib import Path

import torch
import torch.nn.functional as F

from bench._common import (
    log,
    machine_info,
    make_prompts,
    markdown_table,
    rate,
    stopwatch,
    write_results,
)
from edgefire.contract.catalog import Catalog
from edgefire.models.llama import PROJECTIONS, _linear
from edgefire.plugins.quant.evaluate import load_with_codec, perplexity
from edgefire.runtime.engine.llm_engine import EngineConfig
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.loading import create_engine

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
TEXT = Path(__file__).resolve().parent.parent / "tests" / "data" / "perplexity.txt"
CODECS = ("identity", "int8", "int4", "int4-g64")
BATCHES = (1, 32)
NEW_TOKENS = 64
PROMPT_TOKENS = 32


def projection_bytes(model) -> int:
    held = {id(getattr(layer, n)): getattr(layer, n) for w in model.params.values()
            for layer in w.layers for n in PROJECTIONS}
    return sum(t.nbytes for item in held.values()
               for t in ((item,) if isinstance(item, torch.Tensor) else item.tensors()))


def decode_rate(lm, batch: int) -> float:
    """Generated tokens per second over the steps after the one that prefills every prompt."""
    # Drafts off: the plain decode step of each weight form (bench/engine.py measures drafts).
    engine = create_engine(lm, EngineConfig(dtype="bfloat16", speculative="off"))
    prompts = make_prompts(lm.tokenizer.encode, [PROMPT_TOKENS] * batch, seed=batch, tag="q")
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, greedy)
    engine.step()  # prefill (and the first token) of every prompt
    with stopwatch() as t:
        while engine.has_unfinished():
            engine.step()
    return rate(batch * (NEW_TOKENS - 1), t[0])


def helper_overhead_us() -> float:
    """Extra time per decode step of routing a dense projection through _linear (120 calls).
    The two are timed in turn, round after round: timed one after the other, a slow phase of a
    shared host fell on one of them alone, and the difference came out at -1,305 µs."""
    x, w = torch.randn(1, 576, dtype=torch.bfloat16), torch.randn(960, 576, dtype=torch.bfloat16)
    direct, routed = [], []
    for _ in range(7):
        direct.append(timeit.timeit(lambda: F.linear(x, w), number=2000) / 2000)
        routed.append(timeit.timeit(lambda: _linear(x, w), number=2000) / 2000)
    return round((min(routed) - min(direct)) * 120 * 1e6, 2)


def main() -> None:
    # One thread, as a node's single compute thread runs steps; two OpenMP teams on two busy
    # cores turn bfloat16 matrix-vector products into spin-wait stalls.
    torch.set_num_threads(1)
    spec = Catalog.load().get_runnable(MODEL)
    text = TEXT.read_text()
    rows = []
    for codec in CODECS:
        log(f"loading {codec}")
        lm = load_with_codec(spec, codec, Precision.parse("bfloat16"))
        ids = lm.tokenizer.encode(text)
        ppl = perplexity(lm.model, ids)
        proj = projection_bytes(lm.model)
        row = {"codec": codec, "weight_precision": lm.model.weight_precision,
               "perplexity": round(ppl, 3), "text_tokens": len(ids),
               "projection_bytes": proj, "other_bytes": lm.model.weight_bytes - proj,
               "weight_bytes": lm.model.weight_bytes}
        decode_rate(lm, 1)  # warm-up: first-call kernel setup is not decode speed
        for batch in BATCHES:
            log(f"{codec}: decode at batch {batch}")
            row[f"decode_tok_s_b{batch}"] = decode_rate(lm, batch)
        rows.append(row)
        del lm
        gc.collect()
    base = rows[0]
    for row in rows:
        row["perplexity_vs_bf16"] = round(row["perplexity"] / base["perplexity"] - 1, 4)
    result = {"bench": "quant", "model": MODEL, "rows": rows,
              "dense_helper_overhead_us_per_step": helper_overhead_us(),
              "targets": {"int8": 0.01, "int4": 0.08}, "machine": machine_info()}
    header = ["codec", "precision", "perplexity", "Δ vs bf16", "projection MiB", "other MiB",
              "decode tok/s b1", "decode tok/s b32"]
    table = markdown_table(header, [
        [r["codec"], r["weight_precision"], r["perplexity"], f"{r['perplexity_vs_bf16']:+.2%}",
         round(r["projection_bytes"] / 2**20, 1), round(r["other_bytes"] / 2**20, 1),
         r["decode_tok_s_b1"], r["decode_tok_s_b32"]] for r in rows])
    markdown = (f"# Weight-only quantization, {MODEL}\n\n{table}\n"
                "Embeddings, the tied lm_head and norms stay bfloat16 (\"other\"). "
                f"Dense-path dispatch helper: {result['dense_helper_overhead_us_per_step']} "
                "µs per decode step.\n")
    write_results("quant", result, markdown)


if __name__ == "__main__":
    main()
