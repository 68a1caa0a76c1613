"""Workers AI text embeddings over real HTTP with all-MiniLM-L6-v2."""

from __future__ import annotations

import httpx
import pytest
import torch

from edgefire.contract.cities import load_city
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app

pytestmark = pytest.mark.slow

MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"
RUN = f"/client/v4/accounts/acct/ai/run/{MINILM}"


@pytest.fixture(scope="module")
def client(serve):
    node = EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=256))
    with serve(create_app(node)) as base_url, httpx.Client(base_url=base_url,
                                                           timeout=120) as client:
        yield client


def _embed(client: httpx.Client, **inputs) -> dict:
    response = client.post(RUN, json=inputs)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True and body["errors"] == []
    return body["result"]


def test_batch_of_texts(client):
    texts = ["A man is eating food.", "A man is eating bread.", "The stock market fell."]
    result = _embed(client, text=texts)
    assert result["shape"] == [3, 384] and result["pooling"] == "mean"
    vectors = torch.tensor(result["data"])
    assert vectors.shape == (3, 384)
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(3), atol=1e-4, rtol=0)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated + 0.3


def test_one_string(client):
    result = _embed(client, text="hello world", pooling="mean")
    assert result["shape"] == [1, 384] and len(result["data"]) == 1


def test_other_pooling_is_refused(client):
    response = client.post(RUN, json={"text": "x", "pooling": "cls"})
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["code"] == 5006 and "pooling" in error["message"]
