"""The pytest plugin used the way a user's project uses it: a project directory of its own with
its own test file, run by pytest in a subprocess (the plugin comes in through its entry point).

tests/data/edgefire_replay/ holds what USER_TESTS recorded against the real SmolLM2 and
MiniLM (`--edgefire-record`); the fast tests replay it with no node and no model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

RECORDINGS = Path(__file__).parent / "data" / "edgefire_replay"
README = Path(__file__).resolve().parent.parent / "README.md"

# A user's test file: the binding (plain, streamed, an error, an injected fault, a stand-in),
# the OpenAI client, the raw URL.
USER_TESTS = '''
import asyncio

import httpx
import pytest

from edgefire import InferenceUpstreamError

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"

pytestmark = pytest.mark.edgefire_models(SMOL)


def test_binding_answers(edgefire_ai):
    answer = asyncio.run(edgefire_ai.run(SMOL, {"prompt": "Say hello.", "max_tokens": 8}))
    assert isinstance(answer["response"], str) and answer["response"]


def test_binding_streams(edgefire_ai):
    async def collect():
        events = await edgefire_ai.run(SMOL, {"prompt": "Count to three.", "max_tokens": 8,
                                              "stream": True})
        return [event async for event in events]

    events = asyncio.run(collect())
    assert len(events) > 1 and "".join(e.get("response", "") for e in events)


def test_binding_error(edgefire_ai):
    with pytest.raises(InferenceUpstreamError) as error:
        asyncio.run(edgefire_ai.run(SMOL, {"prompt": "Hi", "max_tokens": -1}))
    assert error.value.code == 5006


def test_retry_code_meets_capacity(edgefire_ai):
    with pytest.raises(InferenceUpstreamError) as error:
        asyncio.run(edgefire_ai.run(SMOL, {"prompt": "Hi", "max_tokens": 4},
                                    {"extraHeaders": {"x-edgefire-fault": "capacity"}}))
    assert error.value.code == 3040


def test_code_written_for_llama(edgefire_ai):  # answered by the stand-in, SmolLM2
    answer = asyncio.run(edgefire_ai.run("@cf/meta/llama-3.1-8b-instruct",
                                         {"prompt": "Hi", "max_tokens": 4}))
    assert answer["response"]


def test_openai_chat(edgefire_openai):
    completion = edgefire_openai.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8)
    assert completion.choices[0].message.content


@pytest.mark.edgefire_models(MINILM)
def test_openai_embeddings(edgefire_openai):
    vectors = edgefire_openai.embeddings.create(model=MINILM, input=["edge", "fire"])
    assert [len(v.embedding) for v in vectors.data] == [384, 384]


def test_rest_url(edgefire_url, edgefire_fleet):
    response = httpx.post(
        f"{edgefire_url}/client/v4/accounts/{edgefire_fleet.account_id}/ai/run/{SMOL}",
        json={"prompt": "Hi", "max_tokens": 4},
        headers={"authorization": f"Bearer {edgefire_fleet.token}"}, timeout=600)
    assert response.json()["success"] is True
'''
USER_TEST_COUNT = 8

NO_MODEL = '''
import sys


def test_no_node_and_no_torch(edgefire_fleet):
    assert edgefire_fleet.node_url is None
    assert "torch" not in sys.modules
'''


def test_user_suite_passes_from_recordings_without_a_model(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS, test_no_model=NO_MODEL)
    result = pytester.runpytest_subprocess("--edgefire-replay", str(RECORDINGS),
                                           "--edgefire-replay-speed", "0")
    result.assert_outcomes(passed=USER_TEST_COUNT + 1)


def test_readme_example_passes_from_the_recordings(pytester: pytest.Pytester) -> None:
    section = README.read_text().split("## Testing your code against edgefire", 1)[1]
    [example] = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    pytester.makepyfile(test_my_feature=example)
    result = pytester.runpytest_subprocess("--edgefire-replay", str(RECORDINGS),
                                           "--edgefire-replay-speed", "0")
    result.assert_outcomes(passed=2)


def test_unrecorded_request_fails_the_users_test_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_changed='''
import asyncio

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"


def test_prompt_was_changed(edgefire_ai):
    asyncio.run(edgefire_ai.run(SMOL, {"prompt": "Say goodbye.", "max_tokens": 8}))
''')
    result = pytester.runpytest_subprocess("--edgefire-replay", str(RECORDINGS))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*InferenceUpstreamError: 5090: No recording matches this "
                                 'request*body.prompt: recorded "Say hello.", sent "Say goodbye."'])


def test_plugin_costs_nothing_to_tests_that_do_not_use_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain='''
import sys


def test_plain():
    assert "torch" not in sys.modules
    assert "edgefire.gateway.app" not in sys.modules
''')
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
    assert "--edgefire-replay" in pytester.runpytest_subprocess("--help").stdout.str()
    off = pytester.runpytest_subprocess("-p", "no:edgefire", "--help").stdout.str()
    assert "--edgefire-replay" not in off


def test_record_and_replay_options_are_exclusive(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_both="def test_it(edgefire_url):\n    pass\n")
    result = pytester.runpytest_subprocess("--edgefire-record", "a", "--edgefire-replay", "b")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--edgefire-record and --edgefire-replay are exclusive*"])


@pytest.mark.slow
def test_user_suite_against_the_real_models_records_then_replays(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    recordings = tmp_path / "recordings"
    recorded = pytester.runpytest_subprocess("--edgefire-record", str(recordings))
    recorded.assert_outcomes(passed=USER_TEST_COUNT)
    # One file per distinct request the tests made, named as in the committed recording (the
    # names come from the requests); the node's warm-up calls are not in it.
    assert sorted(p.name for p in recordings.glob("*.json")) == \
        sorted(p.name for p in RECORDINGS.glob("*.json"))
    replayed = pytester.runpytest_subprocess("--edgefire-replay", str(recordings))
    replayed.assert_outcomes(passed=USER_TEST_COUNT)
