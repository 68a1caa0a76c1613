"""The name a model gives the precision its dense weights are held in (`weight_precision`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def dense_precision(dtypes: Iterable[torch.dtype]) -> str:
    """`float32+bfloat16` for (torch.float32, torch.bfloat16); `bfloat16` for one dtype."""
    return "+".join(str(d).removeprefix("torch.") for d in dtypes)
