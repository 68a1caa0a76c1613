"""edgefire runtime: the engine, the catalog and (later) the node that serves them."""

from runtime.engine.llm_engine import EngineConfig, LLMEngine
from runtime.engine.sampling_params import SamplingParams
from runtime.llm import LLM, GenerationResult

__all__ = ["LLM", "EngineConfig", "GenerationResult", "LLMEngine", "SamplingParams"]
