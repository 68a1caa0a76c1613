"""Pipeline-parallel stages of a Llama model: contiguous runs of its layers, one per rank.

The first stage (the root rank, which samples) also holds the embedding and the LM head, so
the logits need no trip back; the last normalises the residual stream and returns it to the
root. Where the layers are cut is a balancer's choice from each layer's measured cost, the
first stage's embedding and LM head counted with its layers.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from edgefire.models.attention import AttentionMetadata
from edgefire.models.llama import LlamaForCausalLM

PROBE_ROWS = 8  # decode rows each layer is timed on: the steps serving is made of
PROBE_REPEATS = 5


def balance(costs: list[float], stages: int, first_extra: float = 0.0) -> list[range]:
    """Contiguous runs of the layers, one per stage, whose largest cost is least (the first
    stage's cost includes first_extra). Each stage gets at least one layer."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"{n} layers cannot be split into {stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[s][i]: the least largest cost of layers [0, i) over stages [0, s]
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages)]
    cut = [[0] * (n + 1) for _ in range(stages)]
    for i in range(1, n + 1):
        best[0][i] = prefix[i] + first_extra
    for s in range(1, stages):
        for i in range(s + 1, n + 1):
            for j in range(s, i):
                worst = max(best[s - 1][j], prefix[i] - prefix[j])
                if worst < best[s][i]:
                    best[s][i], cut[s][i] = worst, j
    bounds, end = [], n
    for s in range(stages - 1, 0, -1):
        bounds.append(range(cut[s][end], end))
        end = cut[s][end]
    bounds.append(range(0, end))
    return bounds[::-1]


@torch.inference_mode()
def measure_costs(model: LlamaForCausalLM, dtype: torch.dtype) -> tuple[list[float], float]:
    """Seconds each layer takes on a decode step of PROBE_ROWS sequences, and what the
    embedding and the LM head take together on it (best of PROBE_REPEATS)."""
    rows, block = PROBE_ROWS, 16
    cache = torch.zeros(model.kv_cache_shape(rows, block), dtype=model.kv_dtype)
    lens = torch.ones(rows, dtype=torch.long)
    tables = torch.arange(rows).view(rows, 1)
    meta = AttentionMetadata(torch.arange(rows) * block, rows, tables, lens,
                             (torch.arange(block)[None, :] < lens[:, None])[None, :, None, :],
                             [])
    ids, positions = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long)

    def best(fn) -> float:
        times = []
        for _ in range(PROBE_REPEATS):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    h = model.embed_tokens(ids, dtype)
    costs = [best(lambda i=i: model.run_layers(h, positions, meta, cache, dtype, layers=range(
        i, i + 1))) for i in range(model.config.num_layers)]
    ends = best(lambda: model.compute_logits(model.final_norm(model.embed_tokens(ids, dtype))))
    return costs, ends


def stage_llama(model: LlamaForCausalLM, layers: range, first: bool) -> LlamaForCausalLM:
    """The stage holding `layers` of model (the same tensors, not copies), and on the first
    stage the embedding and the LM head. The fused native step runs a whole model: stages
    run torch's layers."""
    weights = {}
    for dtype in model.dtypes:
        w = model.params[dtype]
        held = [w.embed, w.lm_head, *(getattr(layer, name) for layer in w.layers
                                      for name in ("qkv", "o", "gate_up", "down"))]
        if not all(isinstance(t, torch.Tensor) for t in held):
            raise ValueError("pipeline parallelism needs dense weights; this model holds "
                             "them in a codec's resident form")
        # Stages after the first look no token up: they hold an empty table.
        table = w.embed if first else w.embed[:0]
        out = {"embed": table, "final_norm": w.final_norm}
        if not model.config.tie_embeddings:
            out["lm_head"] = w.lm_head if first else w.lm_head[:0]
        for i, source in enumerate(layers):
            layer = w.layers[source]
            for name in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down"):
                out[f"layers.{i}.{name}"] = getattr(layer, name)
        weights[dtype] = out
    stage = LlamaForCausalLM(replace(model.config, num_layers=len(layers)), weights,
                             model.dtypes, model.kv_dtype)
    stage.fused_decode = False
    return stage
