"""Warm-start cache: entries round-trip, damaged ones are rebuilt, and a warm load of SmolLM2
skips the GGUF entirely yet decodes exactly as the cold load does."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import gguf
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

import edgefire.plugins.llama
from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.runtime.engine.llm_engine import EngineConfig
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.loading import LoadedLM, create_engine, load_lm
from edgefire.runtime.tokenizer import Tokenizer
from edgefire.runtime.tokenizer.gguf_tokenizer import _Meta
from edgefire.runtime.weights.aligned import ALIGN
from edgefire.runtime.weights.warm_cache import (
    ENV_VAR,
    META_FILE,
    WEIGHTS_FILE,
    WarmCache,
    WarmEntry,
    cache_key,
)

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
PROMPTS = ["The capital of France is Paris. The capital of Germany is",
           "Shopping list:\n1. apples\n2. bananas\n3."]


def _spec(weights: str, **changes) -> ModelSpec:
    spec = ModelSpec(id="@cf/test/toy", task="text-generation", architecture="llama",
                     weights=weights, context_window=64)
    return dataclasses.replace(spec, **changes)


def _toy_entry() -> WarmEntry:
    hf = HFTokenizer(models.WordLevel({"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    weights = {dtype: {"a": torch.arange(6, dtype=dtype).reshape(2, 3),
                       "b": torch.ones(4, dtype=dtype)}
               for dtype in (torch.float32, torch.bfloat16)}
    return WarmEntry(weights, Tokenizer(hf, _Meta(None, None, False, False)), {"config": {"n": 2}})


# ---------------------------------------------------------------- the cache alone


def test_key_follows_everything_a_load_depends_on(tmp_path: Path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"x" * 10)
    spec = _spec(str(source))
    key = cache_key(spec, source, "identity", (torch.float32,))
    assert key == cache_key(spec, source, "identity", (torch.float32,))
    others = [cache_key(spec, source, "identity", (torch.bfloat16,)),
              cache_key(spec, source, "identity", (torch.float32, torch.bfloat16)),
              cache_key(spec, source, "int8", (torch.float32,)),
              cache_key(_spec(str(source), id="@cf/test/other"), source, "identity",
                        (torch.float32,))]
    os.utime(source, ns=(1, 1))
    others.append(cache_key(spec, source, "identity", (torch.float32,)))
    source.write_bytes(b"x" * 11)
    others.append(cache_key(spec, source, "identity", (torch.float32,)))
    assert len({key, *others}) == 1 + len(others)


def test_entry_round_trips_memory_mapped(tmp_path: Path):
    cache = WarmCache(tmp_path)
    cache.store("k", _toy_entry())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]  # no temporary folder left
    entry = cache.load("k")
    assert entry is not None and entry.model_meta == {"config": {"n": 2}}
    for dtype, tensors in _toy_entry().weights.items():
        for name, tensor in tensors.items():
            assert entry.weights[dtype][name].dtype == dtype
            assert torch.equal(entry.weights[dtype][name], tensor)
            assert entry.weights[dtype][name].data_ptr() % ALIGN == 0
    assert entry.tokenizer.encode("hi") == [1]
    assert _is_mapped(entry.weights[torch.float32]["a"], tmp_path / "k" / WEIGHTS_FILE)


@pytest.mark.parametrize("damage", ["truncate_weights", "garbage_meta", "missing_tokenizer",
                                    "extra_tensor_in_meta"])
def test_damaged_entry_is_dropped(tmp_path: Path, caplog, damage: str):
    cache = WarmCache(tmp_path)
    cache.store("k", _toy_entry())
    folder = tmp_path / "k"
    if damage == "truncate_weights":
        with open(folder / WEIGHTS_FILE, "r+b") as f:
            f.truncate((folder / WEIGHTS_FILE).stat().st_size - 8)
    elif damage == "garbage_meta":
        (folder / META_FILE).write_text("{not json")
    elif damage == "missing_tokenizer":
        (folder / "tokenizer.json").unlink()
    else:
        meta = (folder / META_FILE).read_text().replace('"b"', '"b", "c"')
        (folder / META_FILE).write_text(meta)
    with caplog.at_level(logging.WARNING):
        assert cache.load("k") is None
    assert "rebuilding" in caplog.text
    assert not folder.exists()


def test_unwritable_cache_warns_and_does_not_raise(tmp_path: Path, caplog):
    root = tmp_path / "file"
    root.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        WarmCache(root).store("k", _toy_entry())
    assert "warm cache" in caplog.text


def _is_mapped(tensor: torch.Tensor, path: Path) -> bool:
    """Whether tensor's memory lies in a mapping of path (Linux /proc/self/maps)."""
    ptr = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5] == str(path.resolve()):
            low, high = (int(x, 16) for x in parts[0].split("-"))
            if low <= ptr < high:
                return True
    return False


# ---------------------------------------------------------------- SmolLM2, cold and warm


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    return tmp_path


def _forbid_gguf(monkeypatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("a warm load must not touch the GGUF file")

    monkeypatch.setattr(gguf, "GGUFReader", forbidden)
    monkeypatch.setattr(gguf.quants, "dequantize", forbidden)
    monkeypatch.setattr(edgefire.plugins.llama, "load_gguf_tokenizer", forbidden)


def _greedy(loaded: LoadedLM) -> list[list[int]]:
    engine = create_engine(loaded, EngineConfig(kv_cache_bytes=32 << 20, dtype="float32"))
    outputs: dict[str, list[int]] = {}
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), loaded.tokenizer.encode(prompt),
                           SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
        outputs[str(i)] = []
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].extend(out.token_ids)
    return [outputs[str(i)] for i in range(len(PROMPTS))]


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith("."))


@pytest.mark.slow
def test_warm_load_skips_gguf_and_decodes_identically(cache_dir: Path, monkeypatch):
    spec = Catalog.load().get_runnable(MODEL)
    cold = load_lm(spec, Precision.parse("float32"))
    (entry,) = _entries(cache_dir)
    assert sorted(p.name for p in entry.iterdir()) == [META_FILE, "tokenizer.json", WEIGHTS_FILE]

    with monkeypatch.context() as patch:
        _forbid_gguf(patch)
        warm = load_lm(spec, Precision.parse("float32"))
    assert (warm.vocab_size, warm.max_model_len) == (cold.vocab_size, cold.max_model_len)
    assert warm.model.config == cold.model.config
    w = warm.model.params[torch.float32]
    assert _is_mapped(w.embed, entry / WEIGHTS_FILE)
    assert _is_mapped(w.layers[-1].down, entry / WEIGHTS_FILE)
    # every weight on a cache line, as in the cold load (runtime/weights/aligned.py)
    held = [w.embed, w.final_norm, *(getattr(layer, f) for layer in w.layers
                                     for f in type(layer).__slots__)]
    assert all(t.data_ptr() % ALIGN == 0 for t in held)
    for text in [*PROMPTS, "1234 + 5678 = 6912 ✓"]:
        assert warm.tokenizer.encode(text) == cold.tokenizer.encode(text)
    assert warm.tokenizer.stop_token_ids == cold.tokenizer.stop_token_ids
    assert _greedy(warm) == _greedy(cold)


@pytest.mark.slow
def test_corrupt_entry_is_rebuilt_and_other_dtype_misses(cache_dir: Path, monkeypatch, caplog):
    spec = Catalog.load().get_runnable(MODEL)
    load_lm(spec, Precision.parse("float32"))
    (entry,) = _entries(cache_dir)
    with open(entry / WEIGHTS_FILE, "r+b") as f:
        f.truncate(1 << 20)
    with caplog.at_level(logging.WARNING):
        rebuilt = load_lm(spec, Precision.parse("float32"))
    assert "rebuilding" in caplog.text
    assert _entries(cache_dir) == [entry]  # written again under the same key, whole
    assert WarmCache(cache_dir).load(entry.name) is not None
    assert rebuilt.model.params[torch.float32].embed.shape[0] == rebuilt.vocab_size

    calls = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda *a: calls.append(1) or real(*a))
    bf16 = load_lm(spec, Precision.parse("bfloat16"))
    assert calls, "a bfloat16 load must not reuse the float32 entry"
    assert len(_entries(cache_dir)) == 2
    assert bf16.model.params[torch.bfloat16].embed.dtype == torch.bfloat16
