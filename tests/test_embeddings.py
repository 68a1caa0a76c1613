"""all-MiniLM-L6-v2 embeddings: parity with transformers, batching, validation, async batching."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.embeddings import MAX_TEXT_CHARS, AsyncEmbedder, EmbeddingModel
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.model_loader import load_model
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
    return load_model(spec, Precision.parse("auto"))


@pytest.fixture(scope="module")
def model(loaded) -> EmbeddingModel:
    return loaded.model


def test_loads_through_the_plugin_path(loaded):
    assert isinstance(loaded.model, EmbeddingModel)
    assert loaded.spec.task == "text-embeddings"
    assert loaded.max_model_len == 256 and loaded.vocab_size == 30522
    assert loaded.model.dim == loaded.spec.extra["dimensions"] == 384
    # float32 weights, whatever precision was asked for ("auto" may be bfloat16).
    assert 80 << 20 < loaded.model.memory_bytes < loaded.spec.extra["memory_mib"] << 20


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
def test_matches_transformers_reference(model):
    expected, expected_tokens = _reference(SENTENCES)
    vectors, tokens = model.embed(SENTENCES)
    distance = 1 - (vectors * expected).sum(dim=1)
    assert distance.abs().max().item() < 1e-4, distance
    assert tokens == expected_tokens.item()


def test_batch_equals_one_at_a_time(model):
    batched, batched_tokens = model.embed(SENTENCES)
    singles = [model.embed([text]) for text in SENTENCES]
    torch.testing.assert_close(batched, torch.cat([v for v, _ in singles]), atol=1e-5, rtol=0)
    assert batched_tokens == sum(n for _, n in singles)


def test_chunking_keeps_input_order(model):
    small = EmbeddingModel(model.encoder, model.tokenizer, model.max_seq_length, batch_size=3)
    torch.testing.assert_close(small.embed(SENTENCES)[0], model.embed(SENTENCES)[0],
                               atol=1e-5, rtol=0)


def test_vectors_are_unit_norm_with_expected_shape(model):
    vectors, tokens = model.embed(SENTENCES[:5])
    assert vectors.shape == (5, 384) and vectors.dtype == torch.float32
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(5), atol=1e-5, rtol=0)
    assert tokens > 5 * 2  # every text has [CLS] and [SEP] at least


def test_related_sentences_are_closer(model):
    vectors, _ = model.embed(SENTENCES[1:4])
    eating, bread, baby = vectors
    assert eating @ bread > eating @ baby + 0.3


def test_long_text_is_truncated_to_max_seq_length(model):
    _, tokens = model.embed([SENTENCES[18]])
    assert tokens == 256


@pytest.mark.parametrize("bad", [
    [], "a string, not a list", None, ["ok", 3], [b"bytes"], ["x" * (MAX_TEXT_CHARS + 1)],
])
def test_bad_input_is_rejected_naming_text(model, bad):
    with pytest.raises(InvalidInputError) as info:
        model.embed(bad)
    assert info.value.field == "text"


def test_async_embedder_batches_concurrent_callers(model):
    direct = [model.embed([text, text.upper()]) for text in SENTENCES[:8]]

    async def main() -> tuple[list, int]:
        embedder = AsyncEmbedder(model)
        try:
            results = await asyncio.gather(
                *(embedder.embed([text, text.upper()]) for text in SENTENCES[:8]))
            return results, embedder.num_batches
        finally:
            embedder.close()

    results, batches = asyncio.run(main())
    assert batches < 8
    for (vectors, tokens), (expected, expected_tokens) in zip(results, direct, strict=True):
        assert vectors.shape == (2, 384)
        torch.testing.assert_close(vectors, expected, atol=1e-5, rtol=0)
        assert tokens == expected_tokens


def test_async_embedder_does_not_block_the_event_loop(model):
    texts = [SENTENCES[18]] * 64  # a few hundred milliseconds of encoding

    async def main() -> tuple[int, float]:
        embedder = AsyncEmbedder(model)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        start = time.perf_counter()
        try:
            await embedder.embed(texts)
        finally:
            task.cancel()
            embedder.close()
        return ticks, time.perf_counter() - start

    ticks, elapsed = asyncio.run(main())
    assert elapsed > 0.05 and ticks >= 3


def test_async_embedder_rejects_bad_input_alone(model):
    async def main() -> None:
        embedder = AsyncEmbedder(model)
        try:
            good = asyncio.ensure_future(embedder.embed(["fine"]))
            with pytest.raises(InvalidInputError):
                await embedder.embed([1])
            vectors, _ = await good
            assert vectors.shape == (1, 384)
        finally:
            embedder.close()
        with pytest.raises(RuntimeError, match="closed"):
            await embedder.embed(["late"])

    asyncio.run(main())
