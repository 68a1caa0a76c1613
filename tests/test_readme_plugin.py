"""The README's "Writing a plugin" example, run as written."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from edgefire.runtime.plugins import load_plugins

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    text = README.read_text()
    section = text.split("## Writing a plugin", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.fixture
def readme_plugin():
    plugin_source, _usage = _python_blocks()
    module = types.ModuleType("my_plugins")
    exec(compile(plugin_source, "README.md:my_plugins.py", "exec"), module.__dict__)
    host = load_plugins()
    host.register(module, "my_plugins", "README")
    yield module
    host.unregister("my_plugins")


def test_readme_has_the_plugin_and_usage_blocks():
    blocks = _python_blocks()
    assert len(blocks) == 2
    assert "edgefire_register_codecs" in blocks[0] and "LLM(" in blocks[1]


def test_readme_codec_round_trips(readme_plugin):
    import torch

    codec = load_plugins().codecs.get("torch_save")()
    weight = torch.randn(4, 8, dtype=torch.bfloat16)
    assert torch.equal(codec.decode(codec.encode(weight)), weight)


@pytest.mark.slow
def test_readme_usage_runs(readme_plugin, capsys):
    _plugin, usage = _python_blocks()
    exec(compile(usage, "README.md:usage", "exec"), {})
    printed = capsys.readouterr().out.strip()
    token_ids = [int(t) for t in printed.strip("[]").split(",")]
    assert len(token_ids) == 4
