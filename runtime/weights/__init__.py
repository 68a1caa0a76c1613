"""Where weights come from (sources) and how they are read into tensors (readers)."""

from runtime.weights.gguf_reader import GGUFWeights, read_gguf
from runtime.weights.sources import resolve_source

__all__ = ["GGUFWeights", "read_gguf", "resolve_source"]
