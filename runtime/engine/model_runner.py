"""Turns a scheduled batch into model inputs, runs the forward pass and returns logits."""

from __future__ import annotations

import inspect
from typing import Protocol

import torch

from edgefire.models.attention import AttentionMetadata, PrefillSpan
from edgefire.runtime.engine.deterministic import ROW_BLOCK
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.engine.scheduler import ScheduledBatch
from edgefire.runtime.engine.sequence import Sequence


class CausalLM(Protocol):
    kv_dtype: torch.dtype
    weight_precision: str  # as edgefire.runtime.weight_precision names it

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]: ...

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv_cache: torch.Tensor,
                dtype: torch.dtype | None = None, row_block: int | None = None
                ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor,
                       row_block: int | None = None) -> torch.Tensor: ...


def kv_bytes_per_block(model: CausalLM, block_size: int) -> int:
    """Bytes a block of the model's KV takes: its pages here and, for a model whose ranks in
    other processes hold pages of their own (runtime/parallel: ParallelLM, which says what a
    token's KV takes there), theirs too, so that a budget bounds them all."""
    shape = model.kv_cache_shape(1, block_size)
    elsewhere = getattr(model, "kv_bytes_per_token_elsewhere", 0)
    return torch.Size(shape).numel() * model.kv_dtype.itemsize + block_size * elsewhere


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, block_size: int,
                 precision: Precision, decode_rows: int = 0) -> None:
        """decode_rows: the most rows of the model's step that computes each row as a decode,
        bit for bit alike whatever shares the step (models/fused; 0: none). A step of at most
        that many tokens runs its prompt chunks as such rows too, each attending to the context
        up to its own token, as drafts do: one native call instead of the fused decodes beside
        torch's layers for the chunks (most steps when serving 16 clients carry a short
        chunk); deterministic decodes take passes of up to that many rows."""
        self.model = model
        self.decode_rows = decode_rows
        self.block_size = block_size
        self.precision = precision
        self.kv_cache = kv_cache
        # Deterministic mode needs the model to run its projections in fixed row blocks; a
        # plugin model written before `row_block` existed still serves every other request.
        self.row_blocks = all("row_block" in inspect.signature(method).parameters
                              for method in (model.forward, model.compute_logits))
        # Where the small dtype serves decodes only (AVX2: torch's bfloat16 GEMM is slow
        # there), a model whose small-dtype step takes prompt chunks natively gets them too,
        # beside up to decode_rows decodes (INT8/INT4 weights: models/fused/llama_decode.py).
        fused_prompts = getattr(model, "fused_prompts", None)
        self.small_prompts = bool(precision.small_decodes_only and decode_rows
                                  and fused_prompts is not None
                                  and fused_prompts(precision.small))

    def execute(self, batch: ScheduledBatch) -> tuple[list[Sequence], torch.Tensor]:
        """Run one step; return the sequences that reached a new token and their logits (a
        sequence verifying drafts: once per row, in order)."""
        work = list(zip(batch.seqs, batch.num_scheduled_tokens, strict=True))
        if not any(seq.deterministic for seq in batch.seqs):
            return self._forward(work, self._dtype(work), None, self._all_decodes(work))
        # Deterministic sequences (runtime/engine/deterministic.py) get passes whose shapes and
        # dtype depend on nothing else in the step: each prefill chunk alone, and the decodes in
        # the one-token dtype, in passes of up to decode_rows through the model's own step,
        # which computes each row alike whatever shares it, or else all together with fixed
        # row blocks. The rest run as usual.
        shared = [(seq, n) for seq, n in work if not seq.deterministic]
        decodes = [(seq, n) for seq, n in work if seq.deterministic and n == 1]
        one_token = self.precision.for_step(1, decodes_only=True)
        passes = [(shared, self._dtype(shared), None, self._all_decodes(shared))]
        if self.decode_rows:
            passes += [(decodes[i:i + self.decode_rows], one_token, None, True)
                       for i in range(0, len(decodes), self.decode_rows)]
        else:
            passes.append((decodes, one_token, ROW_BLOCK, False))
        passes += [([(seq, n)], self._dtype([(seq, n)]), None, False)
                   for seq, n in work if seq.deterministic and n > 1]
        sample_seqs: list[Sequence] = []
        logits: list[torch.Tensor] = []
        for items, dtype, row_block, all_decodes in passes:
            if items:
                seqs, rows = self._forward(items, dtype, row_block, all_decodes)
                sample_seqs += seqs
                logits.append(rows)
        return sample_seqs, torch.cat(logits)

    def _all_decodes(self, work: list[tuple[Sequence, int]]) -> bool:
        """Whether this step's every row runs as a decode (see decode_rows)."""
        return 0 < sum(n for _, n in work) <= self.decode_rows

    def _dtype(self, work: list[tuple[Sequence, int]]) -> torch.dtype:
        decodes = sum(n for seq, n in work if n == 1 or seq.num_draft)
        total = sum(n for _, n in work)
        decodes_only = self._all_decodes(work) or decodes == total
        if self.small_prompts and not decodes_only and decodes <= self.decode_rows:
            return self.precision.small
        return self.precision.for_step(total, decodes_only)

    def _forward(self, work: list[tuple[Sequence, int]], dtype: torch.dtype,
                 row_block: int | None, all_decodes: bool = False,
                 ) -> tuple[list[Sequence], torch.Tensor]:
        # Decodes first: the attention backend batches them as one group. A sequence verifying
        # speculative drafts is decodes too, one row per token, row j attending to the context
        # up to its own token; every row is sampled.
        order = sorted(work, key=lambda item: item[1] > 1 and not item[0].num_draft)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSpan] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        bs = self.block_size
        for seq, n in order:
            start = seq.num_computed_tokens
            end = start + n
            row = len(input_ids)
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if n == 1 or seq.num_draft or all_decodes:
                decode_tables.extend([table] * n)
                decode_lens.extend(range(start + 1, end + 1))
            else:
                prefills.append(_prefill_span(row, n, end, table))
            if seq.num_draft:
                sample_rows.extend(range(row, row + n))
                sample_seqs.extend([seq] * n)
            elif end == seq.num_tokens:
                sample_rows.append(row + n - 1)
                sample_seqs.append(seq)

        tables = _pad(decode_tables)
        lens = torch.tensor(decode_lens, dtype=torch.long)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            num_decode_tokens=len(decode_tables),
            decode_block_tables=tables,
            decode_context_lens=lens,
            decode_mask=_decode_mask(lens, tables.shape[1] * bs),
            prefills=prefills,
        )
        blocks = {} if row_block is None else {"row_block": row_block}
        hidden = self.model.forward(torch.tensor(input_ids), torch.tensor(positions), meta,
                                    self.kv_cache, dtype, **blocks)
        logits = self.model.compute_logits(hidden[sample_rows], **blocks)
        return sample_seqs, logits


def _prefill_span(row: int, n: int, context_len: int, table: list[int]) -> PrefillSpan:
    mask = None
    if context_len > n:  # earlier chunks or a prefix-cache hit precede this span
        keys = torch.arange(context_len)
        queries = torch.arange(context_len - n, context_len)
        mask = keys[None, :] <= queries[:, None]
    return PrefillSpan(row, n, context_len, torch.tensor(table, dtype=torch.long), mask,
                       mask_is_causal=True)


def _pad(tables: list[list[int]]) -> torch.Tensor:
    width = max((len(t) for t in tables), default=0)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables],
                        dtype=torch.long).view(len(tables), width)


def _decode_mask(lens: torch.Tensor, width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < lens[:, None])[None, :, None, :]
