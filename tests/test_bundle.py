"""Compressed bundles: the container round-trips bit for bit, damage is a typed error naming the
file, and `edgefire compress` of SmolLM2 loads back into the very model the GGUF gives."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import CorruptWeightsError
from edgefire.plugins.unweight import UnweightCodec
from edgefire.runtime import LLM, SamplingParams
from edgefire.runtime.cli import main
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import load_lm
from edgefire.runtime.tokenizer import Tokenizer
from edgefire.runtime.tokenizer.gguf_tokenizer import _Meta
from edgefire.runtime.weights.aligned import ALIGN
from edgefire.runtime.weights.bundle import default_path, read_bundle, write_bundle
from edgefire.runtime.weights.warm_cache import ENV_VAR, WarmEntry
from tests.test_llama_parity import _run_prefill
from tests.test_warm_cache import _forbid_gguf, _spec

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"
PROMPTS = ["The capital of France is Paris. The capital of Germany is",
           "Shopping list:\n1. apples\n2. bananas\n3."]


def _toy_entry() -> WarmEntry:
    generator = torch.Generator().manual_seed(0)
    weights = {"proj": (torch.randn(64, 96, generator=generator) * 0.02).to(torch.bfloat16),
               "norm": torch.ones(96, dtype=torch.bfloat16),  # too small to encode
               "bias": torch.randn(300, generator=generator)}  # not BF16: stored as it is
    hf = HFTokenizer(models.WordLevel({"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    return WarmEntry({torch.bfloat16: weights}, Tokenizer(hf, _Meta(None, None, False, False)),
                     {"config": {"n": 2}})


@pytest.fixture
def toy_bundle(tmp_path: Path) -> Path:
    source = tmp_path / "toy.gguf"
    source.write_bytes(b"pretend weights")
    path = tmp_path / "out" / "toy.unweight.safetensors"
    write_bundle(path, _toy_entry(), UnweightCodec(), architecture="llama", source=source)
    return path


def test_container_round_trips_bit_for_bit(toy_bundle: Path):
    assert [p.name for p in toy_bundle.parent.iterdir()] == [toy_bundle.name]  # no temp file
    with safe_open(toy_bundle, "pt") as f:
        meta = f.metadata()
        assert f.get_tensor("proj").dtype == torch.uint8  # encoded
        assert f.get_tensor("norm").dtype == torch.bfloat16  # kept as it is
    assert json.loads(meta["source"])["name"] == "toy.gguf"
    entry = read_bundle(toy_bundle, "llama", (torch.bfloat16, torch.float32))
    assert entry.model_meta == {"config": {"n": 2}} and entry.tokenizer.encode("hi") == [1]
    (original,) = _toy_entry().weights.values()
    for name, tensor in original.items():
        assert torch.equal(entry.weights[torch.bfloat16][name], tensor.to(torch.bfloat16))
        assert torch.equal(entry.weights[torch.float32][name], tensor.float())
        assert entry.weights[torch.bfloat16][name].data_ptr() % ALIGN == 0


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _strip_marker(path: Path) -> None:
    save_file({"proj": torch.zeros(4)}, path)


@pytest.mark.parametrize("damage, reason", [
    (_truncate, "incomplete"), (_flip_last_byte, "CRC-32"), (_strip_marker, "format marker")])
def test_damaged_bundle_is_a_typed_error_naming_the_file(toy_bundle: Path, damage, reason):
    damage(toy_bundle)
    with pytest.raises(CorruptWeightsError, match=reason) as caught:
        read_bundle(toy_bundle, "llama", (torch.bfloat16,))
    assert str(toy_bundle) in caught.value.message


def test_bundle_of_another_architecture_or_damaged_is_refused_by_the_loader(toy_bundle: Path):
    with pytest.raises(CorruptWeightsError, match="not 'bert'"):
        read_bundle(toy_bundle, "bert", (torch.float32,))
    _truncate(toy_bundle)
    with pytest.raises(CorruptWeightsError, match=re.escape(str(toy_bundle))):
        load_lm(_spec(str(toy_bundle)), Precision.parse("bfloat16"))  # the llama loader


@pytest.mark.parametrize("model, message", [
    ("@cf/nobody/nothing", "No such model"),
    ("@cf/meta/llama-3.1-8b-instruct", "planning only"),
    ("@cf/sentence-transformers/all-minilm-l6-v2", "no bundle exporter named 'bert'")])
def test_compress_refuses_with_exit_code_2(model: str, message: str, capsys, tmp_path: Path):
    assert main(["compress", model, "--out", str(tmp_path / "b.safetensors")]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_default_path_is_under_the_cache_folder(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert default_path(MODEL, "unweight") == (
        tmp_path / "bundles" / "huggingfacetb--smollm2-135m-instruct.unweight.safetensors")


# ---------------------------------------------------------------- SmolLM2, compressed and loaded


@pytest.fixture(scope="module")
def from_gguf() -> LLM:
    spec = dataclasses.replace(Catalog.load().get(MODEL), codec="identity")
    return LLM(MODEL, dtype="bfloat16", catalog=Catalog([spec]))


@pytest.fixture(scope="module")
def compressed(from_gguf: LLM, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("bundle") / "smollm2.unweight.safetensors"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        _forbid_gguf(patch)  # the bfloat16 load above left these weights in the warm cache
        assert main(["compress", MODEL, "--out", str(out)]) == 0
    return out, printed.getvalue()


def _load_bundle(bundle: Path, codec: str, tmp_path: Path, monkeypatch) -> LLM:
    """A catalog entry whose weights are the bundle, loaded in bfloat16 without the GGUF."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(json.dumps({"models": [{
        "id": "@cf/test/smollm2-bundle", "task": "text-generation", "architecture": "llama",
        "weights": str(bundle), "codec": codec, "context_window": 8192}]}))  # JSON is YAML
    with monkeypatch.context() as patch:
        _forbid_gguf(patch)
        return LLM("@cf/test/smollm2-bundle", dtype="bfloat16", catalog=Catalog.load(catalog))


@pytest.mark.slow
def test_compress_saves_at_least_30_percent(compressed: tuple[Path, str]):
    out, summary = compressed
    raw, stored = map(int, re.search(r"(\d+) BF16 bytes -> (\d+) bundle bytes", summary).groups())
    assert stored == out.stat().st_size
    assert 1 - stored / raw >= 0.30


@pytest.mark.slow
def test_bundle_loads_the_same_model_as_the_gguf(compressed: tuple[Path, str], from_gguf: LLM,
                                                 tmp_path: Path, monkeypatch):
    from_bundle = _load_bundle(compressed[0], "identity", tmp_path, monkeypatch)
    ids = [from_gguf.tokenizer.encode(p) for p in PROMPTS]
    assert torch.equal(_run_prefill(from_bundle, ids), _run_prefill(from_gguf, ids))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    assert ([r.token_ids for r in from_bundle.generate(ids, params)]
            == [r.token_ids for r in from_gguf.generate(ids, params)])


@pytest.mark.slow
def test_bundle_loads_into_the_resident_form(compressed: tuple[Path, str], from_gguf: LLM,
                                             tmp_path: Path, monkeypatch):
    """Distribution form on disk -> inference form in memory, bit for bit the same weights."""
    resident = _load_bundle(compressed[0], "unweight", tmp_path, monkeypatch).model
    dense = from_gguf.model.params[torch.bfloat16]
    packed = resident.params[torch.bfloat16]
    assert resident.weight_precision == "bfloat16-unweight"
    pairs = [(packed.embed, dense.embed)] + [
        (getattr(p, name), getattr(d, name))
        for p, d in zip(packed.layers, dense.layers, strict=True)
        for name in ("qkv", "o", "gate_up", "down")]
    for held, weight in pairs:
        assert torch.equal(held.decode().view(torch.int16), weight.view(torch.int16))
