"""SmolLM2 at tp=2 and at pp=2 over two real processes (Gloo), and at pp=2×tp=2 over four: the
same logits (float32, within 1e-4) and greedy tokens as one process, batched as alone; over
HTTP, a killed worker takes the model offline cleanly and the next request brings it back."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace

import httpx
import pytest
import torch

from edgefire.contract.catalog import Catalog
from edgefire.contract.cities import load_city
from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.engine.llm_engine import EngineConfig, LLMEngine
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.loading import build_engine
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.parallel.root import ParallelLM
from edgefire.runtime.server import create_app

pytestmark = pytest.mark.slow

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
TP2 = SMOL + "-tp2"
LAYOUTS = {SMOL + "-tp2": {"tp": 2}, SMOL + "-pp2": {"pp": 2},
           SMOL + "-pp2tp2": {"pp": 2, "tp": 2}}
PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Write a haiku about the sea.\nThe sea"]


def _catalog() -> Catalog:
    """The catalog with SmolLM2 also under each layout's id."""
    catalog = Catalog.load()
    spec = catalog.get_runnable(SMOL)
    return Catalog([*catalog.specs, *(
        replace(spec, id=model_id, aliases=(), extra={**spec.extra, "parallel": layout})
        for model_id, layout in LAYOUTS.items())])


class Recorder:
    """The engine's sampler, keeping every step's logits."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.logits: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor, seqs) -> list[int]:
        self.logits.append(logits.clone())
        return self.sampler(logits, seqs)


def _generate(engine: LLMEngine, prompts: list[str], max_tokens: int = 12) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for i, text in enumerate(prompts):
        engine.add_request(f"r{i}-{time.monotonic_ns()}", engine.tokenizer.encode(text), params)
        tokens[f"r{i}"] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id.split("-")[0]].extend(out.token_ids)
    return [tokens[f"r{i}"] for i in range(len(prompts))]


# float32: the layouts' logits compare at 1e-4; drafts off, so each step is one token.
CONFIG = EngineConfig(dtype="float32", kv_cache_bytes=64 << 20, speculative="off")


@pytest.fixture(scope="module")
def single():
    engine, _ = build_engine(_catalog().get_runnable(SMOL), CONFIG)
    yield engine
    engine.close()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def model_id(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def layout(model_id) -> ParallelLayout:
    return ParallelLayout.parse(LAYOUTS[model_id])


@pytest.fixture(scope="module")
def parallel(model_id):
    engine, _ = build_engine(_catalog().get_runnable(model_id), CONFIG)
    yield engine
    engine.close()


def test_a_layout_gives_the_single_process_logits_and_tokens(single, parallel, layout):
    model = parallel.runner.model
    assert isinstance(model, ParallelLM)
    assert len(model.workers) == layout.world_size - 1
    layers, _, heads, *_ = model.kv_cache_shape(1, 16)
    # The root's pages: with tp its KV heads (2 of SmolLM2's 3), with pp its stage's layers.
    assert heads == (2 if layout.tp > 1 else 3)
    assert (layers < 30) == (layout.pp > 1)
    # The ranks' pages add up to one process's, and the budget bounds them all: as many blocks.
    assert parallel.blocks.num_blocks == single.blocks.num_blocks
    assert parallel.kv_pool_bytes == single.kv_pool_bytes <= CONFIG.kv_cache_bytes
    single.sampler, parallel.sampler = Recorder(single.sampler), Recorder(parallel.sampler)
    for prompt in PROMPTS:
        assert _generate(parallel, [prompt]) == _generate(single, [prompt])
    ours, theirs = parallel.sampler.logits, single.sampler.logits
    assert len(ours) == len(theirs) == 12 * len(PROMPTS)
    worst = max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True))
    assert worst < 1e-4, worst


def test_a_layout_refuses_deterministic_requests_clearly(parallel):
    # Fixed row blocks are a one-process feature: the request is refused, never run otherwise.
    with pytest.raises(InvalidInputError, match="cannot run deterministically"):
        parallel.add_request("det", [1, 2, 3], SamplingParams(max_tokens=2, deterministic=True))


def test_a_layout_batched_is_the_layout_alone(parallel):
    alone = [_generate(parallel, [prompt], 16)[0] for prompt in PROMPTS]
    assert _generate(parallel, PROMPTS, 16) == alone


def test_a_killed_worker_takes_the_model_offline_and_the_next_request_rebuilds_it(serve):
    node = EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=64), catalog=_catalog())
    run = f"/client/v4/accounts/acct/ai/run/{TP2}"
    with serve(create_app(node)) as base_url, httpx.Client(base_url=base_url,
                                                           timeout=120) as client:
        first = client.post(run, json={"prompt": "Hi", "max_tokens": 4, "temperature": 0})
        assert first.status_code == 200, first.text
        served = node.registry.models()[TP2]
        model = served.engine.engine.runner.model
        assert isinstance(model, ParallelLM)
        [(worker, _)] = model.workers
        # Killed while a request streams: the request ends with an error, not a hang.
        with client.stream("POST", run, json={"prompt": "Count to 500: 1, 2,",
                                              "max_tokens": 2000, "stream": True,
                                              "temperature": 0}) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            os.kill(worker.pid, signal.SIGKILL)
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        errors = [event["errors"] for event in rest if "errors" in event]
        assert errors and errors[-1][0]["code"] == 3043, rest[-3:]
        worker.join(10)
        health = client.get("/health").json()
        assert health["status"] == "degraded" and TP2 in health["degraded_models"]

        loads = node.registry.num_loads
        again = client.post(run, json={"prompt": "Hi", "max_tokens": 4, "temperature": 0})
        assert again.status_code == 200, again.text
        assert again.json()["result"]["response"] == first.json()["result"]["response"]
        assert node.registry.num_loads == loads + 1
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["degraded_models"] == []
        rebuilt = node.registry.models()[TP2].engine.engine.runner.model
        assert rebuilt is not model
    node.registry.close()
    for process, _ in rebuilt.workers:  # closing the node stops its workers
        process.join(10)
        assert not process.is_alive()
