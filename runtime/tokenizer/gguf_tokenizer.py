"""Build a HF `tokenizers` tokenizer from the vocabulary stored inside a GGUF file."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from edgefire.runtime.tokenizer.chat_template import ChatTemplate

# GGUF token_type values (llama.cpp's llama_token_type).
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# tokenizer.ggml.pre values whose llama.cpp split is "\p{N}" first, then the GPT-2 regex; the
# HF originals express that as Digits(individual) + ByteLevel. transformers' GGUF loader has no
# entry for these and falls back to the plain GPT-2 regex, which differs before digits.
_DIGIT_SPLIT_PRES = frozenset({"smollm", "starcoder", "refact", "codeshell", "command-r"})
_PLAIN_GPT2_PRES = frozenset({"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"})

# Text matched by llama.cpp as end-of-generation besides eos: chat models close turns with these,
# and <|endoftext|> ends a document; generating past either only produces junk.
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")

_FORMAT_VERSION = 1


@dataclass(slots=True)
class _Meta:
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    stop_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None


class Tokenizer:
    """Thin wrapper over a HF `tokenizers.Tokenizer` plus the GGUF metadata the engine needs."""

    __slots__ = ("_hf", "_meta", "_chat_template", "_special_ids")

    def __init__(self, hf: HFTokenizer, meta: _Meta) -> None:
        self._hf = hf
        self._meta = meta
        self._special_ids = frozenset(
            i for i, t in hf.get_added_tokens_decoder().items() if t.special
        )
        self._chat_template = (
            ChatTemplate(meta.chat_template, self.bos_token or "", self.eos_token or "")
            if meta.chat_template
            else None
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self._hf.id_to_token(i) for i in ids]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    @property
    def hf_tokenizer(self) -> HFTokenizer:
        return self._hf

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self._meta.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._meta.eos_token_id

    @property
    def bos_token(self) -> str | None:
        bos = self._meta.bos_token_id
        return None if bos is None else self._hf.id_to_token(bos)

    @property
    def eos_token(self) -> str | None:
        eos = self._meta.eos_token_id
        return None if eos is None else self._hf.id_to_token(eos)

    @property
    def add_bos_token(self) -> bool:
        return self._meta.add_bos_token

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return frozenset(self._meta.stop_token_ids)

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._chat_template

    def to_json(self) -> str:
        """Serialise everything needed to rebuild this tokenizer without the GGUF file."""
        doc = {"version": _FORMAT_VERSION, "meta": asdict(self._meta), "hf": self._hf.to_str()}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, data: str) -> Tokenizer:
        doc = json.loads(data)
        if doc.get("version") != _FORMAT_VERSION:
            raise ValueError(f"unsupported tokenizer cache version {doc.get('version')!r}")
        return cls(HFTokenizer.from_str(doc["hf"]), _Meta(**doc["meta"]))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _PLAIN_GPT2_PRES:
        return byte_level
    # Guessing a split for an unknown vocabulary would silently produce off-distribution ids.
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}")


def load_gguf_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """Build the tokenizer described by a GGUF file's `tokenizer.*` metadata."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {model!r} (only byte-level BPE)")
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]

    vocab = {tok: i for i, tok in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre", "default"))
    hf.decoder = decoders.ByteLevel()

    # Registered as added tokens so they match whole in raw text (chat markup in prompts)
    # instead of being split into "<", "|", ... by the BPE model.
    def added(kind: int, special: bool) -> list[AddedToken]:
        return [
            AddedToken(tok, special=special, normalized=False, lstrip=False, rstrip=False)
            for tok, t in zip(tokens, types, strict=True)
            if t == kind
        ]

    hf.add_special_tokens(added(_TOKEN_CONTROL, special=True))
    hf.add_tokens(added(_TOKEN_USER_DEFINED, special=False))

    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    # Byte-level BPE vocabularies add no BOS unless the file says so (llama.cpp and the HF
    # originals agree; SmolLM2 stores add_bos_token=False).
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = ["$A"]
        special: list[tuple[str, int]] = []
        if add_bos:
            single.insert(0, tokens[bos])
            special.append((tokens[bos], bos))
        if add_eos:
            single.append(tokens[eos])
            special.append((tokens[eos], eos))
        hf.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=list(dict.fromkeys(special))
        )

    stops = {eos} if eos is not None else set()
    stops.update(vocab[t] for t in _EOG_TEXTS if t in vocab)
    meta = _Meta(
        bos_token_id=bos,
        eos_token_id=eos,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        stop_token_ids=sorted(stops),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )
    return Tokenizer(hf, meta)
