"""The official `openai` client against the OpenAI-compatible routes (SmolLM2, MiniLM)."""

from __future__ import annotations

import math

import openai
import pytest

from edgefire.contract.cities import load_city
from edgefire.contract.headers import WEIGHT_PRECISION
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app
from edgefire.runtime.weight_precision import compute_precision

pytestmark = pytest.mark.slow

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
SMOL_INT8 = f"{SMOL}-int8"
MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"
# The bare question's greedy answer depends on the CPU in bfloat16 (a near tie between "The"
# and "L'"); asking for a sentence is decisive in every precision.
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
COMPUTE = compute_precision(NodeSettings().dtype)  # what the node below holds dense weights in


@pytest.fixture(scope="module")
def client(serve):
    node = EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=256))
    with serve(create_app(node)) as base_url:
        yield openai.OpenAI(base_url=f"{base_url}/client/v4/accounts/acct/ai/v1",
                            api_key="unused", max_retries=0, timeout=120)


def test_chat_completion(client):
    completion = client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=24,
                                                temperature=0)
    assert completion.object == "chat.completion" and completion.model == SMOL
    [choice] = completion.choices
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 < usage.completion_tokens <= 24


def test_precision_in_header_and_system_fingerprint(client):
    # The int8 and unweight variants load here (a few seconds each): the only ones served.
    for model, precision in ((SMOL, COMPUTE), (SMOL_INT8, "int8"),
                             (f"{SMOL}-unweight", "bfloat16-unweight")):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=QUESTION, max_tokens=2)
        assert raw.headers[WEIGHT_PRECISION] == precision
        assert raw.parse().system_fingerprint == f"edgefire-{precision}"
    with client.chat.completions.with_streaming_response.create(
            model=SMOL_INT8, messages=QUESTION, max_tokens=2, stream=True) as response:
        assert response.headers[WEIGHT_PRECISION] == "int8"
        assert {c.system_fingerprint for c in response.parse()} == {"edgefire-int8"}
    raw = client.embeddings.with_raw_response.create(model=MINILM, input="A cat sat.")
    assert raw.headers[WEIGHT_PRECISION] == "float32"


def test_streaming_with_usage_matches_the_completion(client):
    inputs = {"model": SMOL, "messages": QUESTION, "max_completion_tokens": 24,
              "temperature": 0, "seed": 3}
    answer = client.chat.completions.create(**inputs)
    chunks = list(client.chat.completions.create(
        **inputs, stream=True, stream_options={"include_usage": True}))
    first, *middle, last_choice, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in middle)
    assert text == answer.choices[0].message.content
    assert all(c.choices[0].finish_reason is None and c.usage is None for c in middle)
    assert last_choice.choices[0].finish_reason == answer.choices[0].finish_reason
    assert usage_chunk.choices == []
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):  # cached ones may differ
        assert getattr(usage_chunk.usage, key) == getattr(answer.usage, key)


def test_stream_without_usage(client):
    chunks = list(client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=4,
                                                 stream=True))
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason


def test_n_choices_and_stop(client):
    completion = client.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=12,
        n=2, seed=11, temperature=1.0, stop="\n")
    assert [c.index for c in completion.choices] == [0, 1]
    assert all("\n" not in c.message.content for c in completion.choices)
    assert completion.usage.completion_tokens >= 2  # both choices counted


def test_errors_reach_the_client_typed(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SMOL, messages=QUESTION, temperature=9)
    assert caught.value.param == "temperature" and caught.value.code == "5006"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="@cf/acme/nope", messages=QUESTION)
    assert caught.value.code == "5007"


@pytest.mark.parametrize("encoding", ["float", None])  # None: the client asks for base64
def test_embeddings(client, encoding):
    extra = {"encoding_format": encoding} if encoding else {}
    response = client.embeddings.create(model=MINILM, input=["A cat sat.", "Stocks fell."],
                                        **extra)
    assert response.object == "list" and response.model == MINILM
    assert [d.index for d in response.data] == [0, 1]
    for item in response.data:
        assert len(item.embedding) == 384
        assert math.isclose(math.fsum(x * x for x in item.embedding), 1.0, rel_tol=1e-4)
    assert response.usage.prompt_tokens == response.usage.total_tokens > 0


def test_model_list(client):
    assert SMOL in {model.id for model in client.models.list()}
