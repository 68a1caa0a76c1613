"""Short prompt chunks run as decode rows in the fused step (ModelRunner.decode_rows): each row
attends to the context up to its own token. Against float32 they are as close as the prompt
path (torch's layers in BF16), and an engine's steps give the same greedy tokens either way."""

from __future__ import annotations

import torch

from edgefire.models.attention import AttentionMetadata, PrefillSpan
from edgefire.models.llama import LlamaForCausalLM
from edgefire.runtime import SamplingParams
from tests.test_fused_decode import CONFIG, _weights
from tests.test_speculative import _engine


def test_a_prompt_as_decode_rows_is_as_close_to_float32_as_the_prompt_path(tokenizer):
    _engine(tokenizer, "off")  # skips where there is no vectorized fused kernel
    weights = _weights()
    bf16 = LlamaForCausalLM(CONFIG, weights, (torch.bfloat16,))
    fp32 = LlamaForCausalLM(CONFIG, weights, (torch.float32,))
    n, block = 7, 4
    ids, positions, slots = torch.tensor([5, 6, 7, 8, 9, 10, 11]), torch.arange(n), torch.arange(n)
    table = torch.tensor([0, 1])
    none = (torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
            torch.zeros(1, 0, 1, 0).bool())
    prompt = AttentionMetadata(slots, 0, *none, [PrefillSpan(0, n, n, table, None)])
    lens = torch.arange(1, n + 1)
    rows = AttentionMetadata(slots, n, table.expand(n, 2).contiguous(), lens,
                             (torch.arange(2 * block)[None, :] < lens[:, None])[None, :, None],
                             [])

    def logits(model, meta, dtype):
        cache = torch.zeros(CONFIG.num_layers, 2, CONFIG.num_kv_heads, 8, block, CONFIG.head_dim,
                            dtype=dtype)
        with torch.inference_mode():
            return model.compute_logits(model.forward(ids, positions, meta, cache, dtype))

    expected = logits(fp32, prompt, torch.float32)
    as_rows = logits(bf16, rows, torch.bfloat16)
    through_torch = logits(bf16, prompt, torch.bfloat16)
    assert bf16._fused_step().takes(n, rows, torch.zeros(1, dtype=torch.bfloat16), torch.bfloat16,
                                    None)
    assert (as_rows - expected).abs().max() <= 1.25 * (through_torch - expected).abs().max()
    assert torch.equal(as_rows.argmax(-1), expected.argmax(-1))


def test_an_engine_runs_short_chunks_as_decode_rows_with_the_same_greedy_tokens(tokenizer):
    engine = _engine(tokenizer, "off")
    runner = engine.runner
    assert runner.decode_rows > 0
    execute = runner.execute
    mixed_steps = []

    def both_ways(batch):
        rows, runner.decode_rows = runner.decode_rows, 0
        try:
            expected_seqs, expected = execute(batch)  # prompt chunks through torch's layers
        finally:
            runner.decode_rows = rows
        seqs, logits = execute(batch)  # every row a decode in the fused step
        assert seqs == expected_seqs
        assert torch.equal(logits.argmax(-1), expected.argmax(-1))
        if any(n > 1 for n in batch.num_scheduled_tokens) and len(batch.seqs) > 1:
            mixed_steps.append(list(batch.num_scheduled_tokens))
        return seqs, logits

    runner.execute = both_ways
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
    for i, prompt in enumerate([[5, 6, 7, 8, 9, 10, 11], [40, 41, 42], [9, 9, 9, 9, 9, 9]]):
        engine.add_request(f"r{i}", prompt, params)
    engine.step()
    engine.add_request("late", list(range(20, 33)), params)  # a chunk beside three decodes
    while engine.has_unfinished():
        engine.step()
    assert [7, 3, 6] in mixed_steps and any(13 in step for step in mixed_steps)
