"""What the node serves per loaded model: a text engine or an encoder, with its footprint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tokenizers import decoders

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.errors import ModelUnavailableError
from edgefire.contract.schemas import TEXT_EMBEDDINGS, TEXT_GENERATION
from edgefire.runtime.engine.async_engine import AsyncEngine
from edgefire.runtime.engine.compute_thread import ComputeThread
from edgefire.runtime.engine.encoder import AsyncEncoder
from edgefire.runtime.engine.llm_engine import EngineConfig
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import build_engine, load_encoder
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.tokenizer import Tokenizer


@dataclass(slots=True)
class ServedLM:
    spec: ModelSpec
    engine: AsyncEngine
    tokenizer: Tokenizer
    max_model_len: int
    memory_bytes: int
    weight_precision: str  # the loaded model's own (edgefire.runtime.weight_precision)
    max_token_chars: int | None  # longest_token_chars(tokenizer)

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    @property
    def dead(self) -> bool:
        return self.engine.dead

    @property
    def degraded(self) -> bool:
        return self.engine.degraded

    def mark_degraded(self) -> None:
        self.engine.mark_degraded()

    def close(self) -> None:
        self.engine.shutdown()


@dataclass(slots=True)
class ServedEncoder:
    spec: ModelSpec
    encoder: AsyncEncoder
    dimensions: int
    max_tokens: int
    memory_bytes: int
    weight_precision: str

    # A failed embedding batch fails only its own requests: the encoder never dies.
    dead: ClassVar[bool] = False
    degraded: ClassVar[bool] = False

    def mark_degraded(self) -> None:
        """Never called: only a dead model is rebuilt, and an encoder does not die."""

    def close(self) -> None:
        self.encoder.close()


def longest_token_chars(tokenizer: Tokenizer) -> int | None:
    """The most characters of text one token can stand for; None if that is not bounded.

    Byte-level BPE covers every byte of a text with exactly one token (an added token, such as
    `<|im_start|>`, matches its own text whole). A vocabulary token's string is written one
    character per byte, so it covers at most len(token) bytes, hence at most len(token)
    characters (a character is one to four bytes). So a text of N characters has at least
    ceil(N / L) tokens, L the longest token string, added ones included: SmolLM2's is 81.
    Other tokenizers may drop text (a whitespace split) or shrink it first (a normalizer such
    as NFKC), so they get no bound.
    """
    hf = tokenizer.hf_tokenizer
    if hf.normalizer is not None or not isinstance(hf.decoder, decoders.ByteLevel):
        return None
    return max(map(len, hf.get_vocab(with_added_tokens=True)))


def build_served_model(spec: ModelSpec, settings: NodeSettings,
                       compute: ComputeThread) -> ServedLM | ServedEncoder:
    """Load spec for serving (seconds); it will run its steps on `compute`."""
    if spec.task == TEXT_GENERATION:
        config = EngineConfig(kv_cache_bytes=settings.kv_cache_mib << 20,
                              max_num_seqs=settings.max_num_seqs,
                              max_num_batched_tokens=settings.max_num_batched_tokens,
                              dtype=settings.dtype, kv_backend=settings.kv_backend,
                              deterministic=settings.deterministic)
        engine, loaded = build_engine(spec, config)
        memory = loaded.model.weight_bytes + engine.kv_pool_bytes
        return ServedLM(spec, AsyncEngine(engine, compute), loaded.tokenizer,
                        engine.config.max_model_len, memory, loaded.model.weight_precision,
                        longest_token_chars(loaded.tokenizer))
    if spec.task == TEXT_EMBEDDINGS:
        encoder = load_encoder(spec, Precision.parse(settings.dtype)).encoder
        return ServedEncoder(spec, AsyncEncoder(encoder, executor=compute), encoder.dim,
                             encoder.max_seq_length, encoder.memory_bytes,
                             encoder.weight_precision)
    raise ModelUnavailableError(f"{spec.id}: task {spec.task!r} is not served by this node",
                                field="model")
