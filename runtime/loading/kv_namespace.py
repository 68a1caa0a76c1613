"""The namespace a KV store's pages of one loaded model live under.

Two nodes share pages only when they would compute the same K and V: the same model id and
architecture, weights, KV dtype and page layout. The weights of a torch module enter as a
fingerprint (every tensor's name, dtype and shape, and its first and last elements), which
tells apart any two weight files or precisions a node would serve without reading them whole.
"""

from __future__ import annotations

import hashlib
import json

import torch

from edgefire.runtime.loading.loaded import LoadedLM

_SAMPLE = 1024  # elements at each end of every tensor


def kv_namespace(loaded: LoadedLM, block_size: int) -> str:
    model, spec = loaded.model, loaded.spec
    h = hashlib.sha256(json.dumps({
        "model": spec.id, "architecture": spec.architecture, "weights": spec.weights,
        "codec": spec.codec, "kv_dtype": str(model.kv_dtype),
        "page": list(model.kv_cache_shape(1, block_size)),
    }, sort_keys=True).encode())
    if isinstance(model, torch.nn.Module):
        for name, tensor in sorted(model.state_dict().items()):
            h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            if tensor.is_contiguous() and tensor.numel() and not tensor.is_meta:
                flat = tensor.detach().reshape(-1)
                for part in (flat[:_SAMPLE], flat[-_SAMPLE:]):
                    h.update(part.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]
