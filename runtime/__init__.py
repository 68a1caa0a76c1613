"""The node side: engine, loading, node and its HTTP server. For offline use:
`from edgefire.runtime import LLM, SamplingParams`.

The names are imported on first use (PEP 562), so a command that needs no engine, such as
`edgefire plan` or `edgefire --help`, does not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "EngineConfig": "edgefire.runtime.engine.llm_engine",
    "LLMEngine": "edgefire.runtime.engine.llm_engine",
    "SamplingParams": "edgefire.runtime.engine.sampling_params",
    "LLM": "edgefire.runtime.llm",
    "GenerationResult": "edgefire.runtime.llm",
}

__all__ = ["LLM", "EngineConfig", "GenerationResult", "LLMEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
