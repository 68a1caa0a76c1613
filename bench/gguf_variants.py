"""Q8_0 and BF16 rewrites of the shipped Q4_1 GGUF, so llama.cpp is measured at its best.

llama.cpp's speed depends on the weight format (Q4_1 reads the least memory, Q8_0 and BF16
have cheaper kernels), so the peers run every format and each ratio takes the fastest. Every
metadata key and tensor is copied; 2-D weights are re-encoded from float32, 1-D (norms) stay
F32. Cached in $EDGEFIRE_PEERS/gguf/; `python -m bench.gguf_variants` writes and checks them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf import LlamaFileType

SHIPPED = "q4_1"  # the name the shipped file goes by among the variants


@dataclass(slots=True, frozen=True)
class Format:
    qtype: QType  # what 2-D weights are re-encoded as
    file_type: LlamaFileType  # general.file_type, which llama.cpp prints as the model's type


FORMATS: dict[str, Format] = {
    "q8_0": Format(QType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "bf16": Format(QType.BF16, LlamaFileType.MOSTLY_BF16),
}


def cache_dir() -> Path:
    root = os.environ.get("EDGEFIRE_PEERS", str(Path.home() / ".cache/edgefire-peers"))
    return Path(root) / "gguf"


def variant_path(source: Path, name: str) -> Path:
    # Name, size and mtime: a changed source gets new rewrites without hashing 100 MB each run.
    st = source.stat()
    return cache_dir() / f"{source.stem}.{st.st_size}-{st.st_mtime_ns}.{name}.gguf"


def _reencode(tensor: gguf.ReaderTensor, qtype: QType) -> tuple[np.ndarray, QType]:
    """The tensor's bytes in qtype (1-D tensors stay F32), with the type they are in."""
    kind = QType(tensor.tensor_type)
    if len(tensor.shape) < 2:
        return gguf.quants.dequantize(tensor.data, kind).astype(np.float32), QType.F32
    if kind == qtype:  # already there (the shipped token_embd is Q8_0): keep it bit for bit
        return np.asarray(tensor.data), kind
    return gguf.quants.quantize(gguf.quants.dequantize(tensor.data, kind), qtype), qtype


def rewrite(source: Path, dest: Path, fmt: Format) -> None:
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    # Renamed once whole: a killed run leaves no bad cache, two runs no mixed file.
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        # GGUF.* are the header's own counts; the writer adds general.architecture itself,
        # and general.file_type (below) names the new format.
        if field.name.startswith("GGUF.") or field.name in (gguf.Keys.General.ARCHITECTURE,
                                                            gguf.Keys.General.FILE_TYPE):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), main, sub_type=sub)
    writer.add_file_type(int(fmt.file_type))
    for tensor in reader.tensors:
        data, qtype = _reencode(tensor, fmt.qtype)
        raw = None if qtype == QType.F32 else qtype
        writer.add_tensor(tensor.name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(dest)


def ensure_variants(source: Path, names: Sequence[str]) -> dict[str, Path]:
    """The GGUF for each variant name (q4_1 is the source itself), writing missing rewrites."""
    out: dict[str, Path] = {}
    for name in names:
        if name == SHIPPED:
            out[name] = source
            continue
        if name not in FORMATS:
            raise ValueError(f"unknown llama.cpp variant {name!r}; known: "
                             f"{', '.join([SHIPPED, *FORMATS])}")
        path = variant_path(source, name)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            rewrite(source, path, FORMATS[name])
        out[name] = path
    return out


def bf16_max_error(source: Path, rewritten: Path) -> float:
    """Largest |rewritten - bf16(source)| over all tensors; 0.0 when the rewrite is exact.
    The reference rounds with torch, not the gguf package that wrote the file."""
    new = {t.name: t for t in gguf.GGUFReader(rewritten).tensors}
    worst = 0.0
    for t in gguf.GGUFReader(source).tensors:
        ref = torch.from_numpy(gguf.quants.dequantize(t.data, QType(t.tensor_type)).copy())
        if len(t.shape) >= 2:
            ref = ref.to(torch.bfloat16).float()
        got = new[t.name]
        back = torch.from_numpy(gguf.quants.dequantize(got.data, QType(got.tensor_type)).copy())
        worst = max(worst, float((back - ref).abs().max()))
    return worst


if __name__ == "__main__":
    from edgefire.contract.catalog import Catalog
    from edgefire.runtime.weights import resolve_source

    spec = Catalog.load().get_runnable("@cf/huggingfacetb/smollm2-135m-instruct")
    paths = ensure_variants(Path(resolve_source(spec.weights)), [SHIPPED, *FORMATS])
    for variant, path in paths.items():
        print(f"{variant}: {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    print(f"bf16 max |rewrite - bf16(source)|: {bf16_max_error(paths[SHIPPED], paths['bf16'])}")
