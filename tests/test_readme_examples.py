"""The README's examples, run as written against a private `make run` fleet (`edge-gateway dev`
in a temporary directory, its dev file where the README reads it). Only the gateway's port is
swapped for the fleet's. "Writing a plugin" has its own test (tests/test_readme_plugin.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak_fleet import Fleet, private_fleet

README = Path(__file__).resolve().parent.parent / "README.md"
README_GATEWAY = "127.0.0.1:8787"

pytestmark = pytest.mark.slow


def _blocks(lang: str, marker: str) -> list[str]:
    """The README's `lang` code blocks that contain `marker`, in order."""
    return [b for b in re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)
            if marker in b]


def _block(lang: str, marker: str) -> str:
    """The README's one `lang` code block that contains `marker`."""
    blocks = _blocks(lang, marker)
    assert len(blocks) == 1, f"README: expected one {lang} block with {marker!r}"
    return blocks[0]


@pytest.fixture(scope="module")
def fleet():
    with private_fleet("fra") as running:
        yield running


def _run(fleet: Fleet, argv: list[str], source: str) -> str:
    source = source.replace(README_GATEWAY, fleet.gateway_url.removeprefix("http://"))
    done = subprocess.run([*argv, source], cwd=fleet.log_path.parent, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_curl_examples(fleet):
    # curl exits 0 on an HTTP error; --fail-with-body makes an error answer fail the block.
    # The first block sets $AI and $TOKEN; the later ones (JSON mode) use them.
    talk, *more = _blocks("bash", "curl $AI/run")
    script = ('set -euo pipefail\ncurl() { command curl -sS --fail-with-body "$@"; echo; }\n'
              + "\n".join([talk, *more]))
    out = _run(fleet, ["bash", "-c"], script)
    assert '"success":true' in out and "data: [DONE]" in out and '"shape":[2,384]' in out
    assert more and '"finish_reason":"stop"' in out


def test_the_openai_client_example(fleet):
    out = _run(fleet, [sys.executable, "-c"], _block("python", "from openai import OpenAI"))
    assert out.strip()


def test_the_env_ai_binding_example(fleet):
    out = _run(fleet, [sys.executable, "-c"], _block("python", "from edgefire import AI"))
    assert "5007: No such model @cf/no/such-model or task" in out


def test_the_offline_llm_example(fleet):
    out = _run(fleet, [sys.executable, "-c"], _block("python", "llm.chat("))
    assert out.count("Usage(") == 2


def test_the_miniature_example(fleet):
    """`make run` answers Kimi K2.5 through the gateway, as its miniature, and says so."""
    talk = _blocks("bash", "curl $AI/run")[0]
    setup = [line for line in talk.splitlines() if line.startswith(("ACCT=", "TOKEN=", "AI="))]
    script = "set -euo pipefail\n" + "\n".join([*setup, _block("bash", "kimi-k2.5 -H")])
    out = _run(fleet, ["bash", "-c"], script)
    assert out.lower().startswith("x-edgefire-miniature: miniature: num_layers 4 of 61")
    assert "weights seeded at random" in out
