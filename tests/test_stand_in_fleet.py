"""Stand-in models and fault injection in a real `make run` fleet (`edge-gateway dev` started
privately): Llama 3.1 8B, which this machine cannot run, answered by the real SmolLM2 through
the `edgefire` binding and the `openai` client; with both settings turned off, clear errors."""

from __future__ import annotations

import asyncio

import openai
import pytest

from bench.soak_fleet import Fleet, private_fleet
from edgefire import AI
from edgefire.contract.headers import FAULT, STAND_IN
from edgefire.errors import InferenceUpstreamError

pytestmark = pytest.mark.slow

LLAMA = "@cf/meta/llama-3.1-8b-instruct"
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
LLAMA_PRICE = (0.282, 0.827)  # catalog.yaml, USD per M tokens in and out
CHAT = [{"role": "user", "content": "Say hello"}]


def _openai(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet.gateway_url}/client/v4/accounts/{fleet.account}/ai/v1",
                         api_key=fleet.token, max_retries=0, timeout=300)


async def _binding(fleet: Fleet) -> tuple[dict, str, dict]:
    async with AI(fleet.gateway_url, fleet.account, fleet.token) as ai:
        raw = await ai.run(LLAMA, {"prompt": "Say hello", "max_tokens": 8},
                           {"returnRawResponse": True})
        answer = await ai.run(LLAMA, {"prompt": "Say hello", "max_tokens": 8},
                              {"gateway": {"id": "default"}})
        log = await ai.gateway("default").get_log(ai.aiGatewayLogId)
        with pytest.raises(InferenceUpstreamError) as caught:
            await ai.run(LLAMA, {"prompt": "Hi"}, {"extraHeaders": {FAULT: "capacity"}})
        assert (caught.value.status, caught.value.code) == (429, 3040)
        return answer, raw.headers[STAND_IN], log


def test_make_run_answers_llama_with_smollm2_and_injects_faults(monkeypatch):
    with private_fleet("fra") as fleet:
        answer, header, log = asyncio.run(_binding(fleet))
        assert header == SMOL
        assert isinstance(answer["response"], str) and answer["response"].strip()
        assert (log["model"], log["stand_in"]) == (LLAMA, SMOL)
        assert log["tokens_in"] > 0 and log["tokens_out"] > 0
        assert log["cost"] == pytest.approx(
            (log["tokens_in"] * LLAMA_PRICE[0] + log["tokens_out"] * LLAMA_PRICE[1]) / 1e6)

        client = _openai(fleet)
        raw = client.chat.completions.with_raw_response.create(model=LLAMA, messages=CHAT,
                                                                max_tokens=8)
        completion = raw.parse()
        assert raw.headers[STAND_IN] == SMOL and completion.model == SMOL
        assert completion.choices[0].message.content.strip()
        # A real stream, cut after three events as a dropped node connection cuts it.
        received = []
        with pytest.raises(openai.APIError, match="upstream failed mid-stream"):
            for chunk in client.chat.completions.create(
                    model=LLAMA, messages=CHAT, max_tokens=32, stream=True,
                    extra_headers={FAULT: "stream-cut"}):
                received.append(chunk)
        assert len(received) == 3 and {chunk.model for chunk in received} == {SMOL}

    monkeypatch.setenv("EDGEFIRE_STAND_IN_MODEL", "")
    monkeypatch.setenv("EDGEFIRE_FAULT_INJECTION", "false")
    with private_fleet("fra") as fleet:
        with pytest.raises(openai.BadRequestError) as caught:
            _openai(fleet).chat.completions.create(model=LLAMA, messages=CHAT)
        assert caught.value.code == "5018"
        assert "set EDGEFIRE_STAND_IN_MODEL" in caught.value.message
        with pytest.raises(openai.BadRequestError, match="fault injection is off"):
            _openai(fleet).chat.completions.create(model=SMOL, messages=CHAT,
                                                   extra_headers={FAULT: "capacity"})
