"""edgefire runtime: the engine, the catalog and (later) the node that serves them."""

from edgefire.runtime.engine.llm_engine import EngineConfig, LLMEngine
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.llm import LLM, GenerationResult

__all__ = ["LLM", "EngineConfig", "GenerationResult", "LLMEngine", "SamplingParams"]
