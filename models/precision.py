"""What a model says of its weights: the precision its dense weights are held in
(`weight_precision`) and the memory they take (`weight_bytes`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def dense_precision(dtypes: Iterable[torch.dtype]) -> str:
    """`float32+bfloat16` for (torch.float32, torch.bfloat16); `bfloat16` for one dtype."""
    return "+".join(str(d).removeprefix("torch.") for d in dtypes)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind tensors: a tied, shared or viewed weight (an
    upcycled miniature's expert copies, one float32 router in every dtype's copy) counts once."""
    seen: dict[int, int] = {}
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def layered_bytes(params: Iterable) -> int:
    """storage_bytes of decoder weights held per dtype (objects with embed, final_norm, lm_head
    and layers whose tensors() list theirs)."""
    return storage_bytes(t for w in params for t in (
        w.embed, w.final_norm, w.lm_head, *(t for layer in w.layers for t in layer.tensors())))


def per_dtype(weights: dict, dtypes: tuple[torch.dtype, ...]) -> dict[torch.dtype, dict]:
    """One dict of weights per compute dtype: `weights` itself when it is already keyed by
    dtype (a warm cache's, kept as they are), else the one dict for each dtype to cast."""
    return weights if isinstance(next(iter(weights)), torch.dtype) else dict.fromkeys(dtypes,
                                                                                       weights)
