"""all-MiniLM-L6-v2 embeddings: parity with transformers, batching, validation, async batching."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.engine.encoder import MAX_TEXT_CHARS, AsyncEncoder, TextEncoder
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import load_encoder, load_lm
from edgefire.runtime.weights import resolve_source

MODEL = "@cf/sentence-transformers/all-minilm-l6-v2"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "Paris is the capital and most populous city of France.",
    "How do I reset my password?",
    "",
    "ok",
    "Café naïve résumé — déjà vu, señor.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "I ❤️ pizza 🍕 and tacos 🌮!!!",
    "def add(a, b):\n    return a + b",
    "Call 555-0199 before 10:30pm on 2024-03-15, or email help@example.com.",
    "   leading and trailing   whitespace   ",
    "UPPER CASE AND lower case ARE the SAME for an uncased model",
    "Photosynthesis converts light energy into chemical energy stored in glucose. " * 3,
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    # Longer than 256 tokens: both sides must truncate at max_seq_length.
    " ".join(f"word{i} is followed by another token" for i in range(120)),
    "Is this the real life? Is this just fantasy?",
]


@pytest.fixture(scope="module")
def loaded():
    spec = Catalog.load().get(MODEL)
    return load_encoder(spec, Precision.parse("auto"))


@pytest.fixture(scope="module")
def encoder(loaded) -> TextEncoder:
    return loaded.encoder


def test_loads_through_the_plugin_path(loaded):
    encoder = loaded.encoder
    assert isinstance(encoder, TextEncoder)
    assert loaded.spec.task == "text-embeddings"
    assert encoder.max_seq_length == 256 and encoder.tokenizer.get_vocab_size() == 30522
    assert encoder.dim == loaded.spec.extra["dimensions"] == 384
    # float32 weights, whatever precision was asked for ("auto" may be bfloat16).
    assert 80 << 20 < encoder.memory_bytes < loaded.spec.need_bytes


def test_an_encoder_is_not_loaded_as_a_language_model(loaded):
    with pytest.raises(TypeError, match="loads a LoadedEncoder, not the LoadedLM"):
        load_lm(loaded.spec, Precision.parse("auto"))


def _reference(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """sentence-transformers' computation: BertModel, mean over the mask, L2 normalisation."""
    from transformers import AutoModel, AutoTokenizer

    folder = resolve_source(Catalog.load().get(MODEL).weights)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256,
                      return_tensors="pt")
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1), batch["attention_mask"].sum()


@pytest.mark.slow
def test_matches_transformers_reference(encoder):
    expected, expected_tokens = _reference(SENTENCES)
    vectors, tokens = encoder.embed(SENTENCES)
    distance = 1 - (vectors * expected).sum(dim=1)
    assert distance.abs().max().item() < 1e-4, distance
    assert tokens == expected_tokens.item()


def test_forwards_build_no_onednn_primitive_per_shape(encoder, capfd):
    # oneDNN builds and caches a primitive per tensor shape (its GELU did, for every batch
    # shape), which grew a node by hundreds of MiB under embeddings load; no step of the
    # encoder may reach it.
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        for count in (1, 2, 5):
            encoder.embed(SENTENCES[:count])
    executed = [line for line in capfd.readouterr().out.splitlines()
                if line.startswith("onednn_verbose") and ",primitive,exec," in line]
    assert executed == []


def test_batch_equals_one_at_a_time(encoder):
    batched, batched_tokens = encoder.embed(SENTENCES)
    singles = [encoder.embed([text]) for text in SENTENCES]
    torch.testing.assert_close(batched, torch.cat([v for v, _ in singles]), atol=1e-5, rtol=0)
    assert batched_tokens == sum(n for _, n in singles)


def test_chunking_keeps_input_order(encoder):
    small = TextEncoder(encoder.encoder, encoder.tokenizer, encoder.max_seq_length, batch_size=3)
    torch.testing.assert_close(small.embed(SENTENCES)[0], encoder.embed(SENTENCES)[0],
                               atol=1e-5, rtol=0)


def test_vectors_are_unit_norm_with_expected_shape(encoder):
    vectors, tokens = encoder.embed(SENTENCES[:5])
    assert vectors.shape == (5, 384) and vectors.dtype == torch.float32
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(5), atol=1e-5, rtol=0)
    assert tokens > 5 * 2  # every text has [CLS] and [SEP] at least


def test_related_sentences_are_closer(encoder):
    vectors, _ = encoder.embed(SENTENCES[1:4])
    eating, bread, baby = vectors
    assert eating @ bread > eating @ baby + 0.3


def test_long_text_is_truncated_to_max_seq_length(encoder):
    _, tokens = encoder.embed([SENTENCES[18]])
    assert tokens == 256


@pytest.mark.parametrize("bad", [
    [], "a string, not a list", None, ["ok", 3], [b"bytes"], ["x" * (MAX_TEXT_CHARS + 1)],
])
def test_bad_input_is_rejected_naming_text(encoder, bad):
    with pytest.raises(InvalidInputError) as info:
        encoder.embed(bad)
    assert info.value.field == "text"


def test_async_encoder_batches_concurrent_callers(encoder):
    direct = [encoder.embed([text, text.upper()]) for text in SENTENCES[:8]]

    async def main() -> tuple[list, int]:
        async_encoder = AsyncEncoder(encoder)
        try:
            results = await asyncio.gather(
                *(async_encoder.embed([text, text.upper()]) for text in SENTENCES[:8]))
            return results, async_encoder.num_batches
        finally:
            async_encoder.close()

    results, batches = asyncio.run(main())
    assert batches < 8
    for (vectors, tokens), (expected, expected_tokens) in zip(results, direct, strict=True):
        assert vectors.shape == (2, 384)
        torch.testing.assert_close(vectors, expected, atol=1e-5, rtol=0)
        assert tokens == expected_tokens


def test_async_encoder_does_not_block_the_event_loop(encoder):
    texts = [SENTENCES[18]] * 64  # a few hundred milliseconds of encoding

    async def main() -> tuple[int, float]:
        async_encoder = AsyncEncoder(encoder)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        start = time.perf_counter()
        try:
            await async_encoder.embed(texts)
        finally:
            task.cancel()
            async_encoder.close()
        return ticks, time.perf_counter() - start

    ticks, elapsed = asyncio.run(main())
    assert elapsed > 0.05 and ticks >= 3


def test_async_encoder_rejects_bad_input_alone(encoder):
    async def main() -> None:
        async_encoder = AsyncEncoder(encoder)
        try:
            good = asyncio.ensure_future(async_encoder.embed(["fine"]))
            with pytest.raises(InvalidInputError):
                await async_encoder.embed([1])
            vectors, _ = await good
            assert vectors.shape == (1, 384)
        finally:
            async_encoder.close()
        with pytest.raises(RuntimeError, match="closed"):
            await async_encoder.embed(["late"])

    asyncio.run(main())
