"""The node side: engine, loading, node and its HTTP server. For offline use:
`from edgefire.runtime import LLM, SamplingParams`."""

from edgefire.runtime.engine.llm_engine import EngineConfig, LLMEngine
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.llm import LLM, GenerationResult

__all__ = ["LLM", "EngineConfig", "GenerationResult", "LLMEngine", "SamplingParams"]
