"""BF16 matmuls run at bucketed row counts: few shapes, the same rows out."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgefire.models.row_buckets import EXACT_BELOW, bucket_rows, dense_linear


def test_buckets_are_few_and_never_smaller():
    buckets = {bucket_rows(rows) for rows in range(1, 1025)}
    assert len(buckets) <= EXACT_BELOW + 41
    for rows in range(1, 1025):
        assert rows <= bucket_rows(rows) <= rows * 1.125
    assert [bucket_rows(r) for r in (31, 32, 33, 257, 300)] == [31, 32, 36, 288, 320]


def test_padded_rows_give_the_same_answer():
    torch.manual_seed(0)
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    for rows in (1, 31, 33, 100, 257):
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        got = dense_linear(x, w)
        assert got.shape == (rows, 96)
        torch.testing.assert_close(got, F.linear(x, w), rtol=1.6e-2, atol=1e-2)
    x32 = torch.randn(40, 64)
    assert torch.equal(dense_linear(x32, w.float()), F.linear(x32, w.float()))  # untouched
