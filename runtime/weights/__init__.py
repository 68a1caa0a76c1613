"""Where weights come from (sources) and how they are read into tensors (readers)."""

from edgefire.runtime.weights.gguf_reader import GGUFWeights, read_gguf
from edgefire.runtime.weights.sources import resolve_source

__all__ = ["GGUFWeights", "read_gguf", "resolve_source"]
