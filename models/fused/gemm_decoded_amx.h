// A codec's rows (row_decoder.h) multiplied on AMX tiles, where the CPU has them and the kernel
// lets this process use them (gemm_amx.h).
//
// Why: the dot-product path (projection.h, apply_decoded) multiplies each decoded tile of
// four weight rows against the rows of x in AVX512-BF16 dot products, which past a few rows
// of x bound the step; the fused step gave way to torch's path (the whole weight decoded,
// then oneDNN's AMX GEMM) past 16 rows. Unweight's resident SmolLM2 on a 2-core Xeon with
// AMX decoded 3-6% faster than dense BF16 at one token, 36-42% slower at 8 and 65% at 32.
// Here the decoded rows are the tiles' A operand as they lie, 16 weight rows of 32 values a
// tile, and x is laid once per call as the B operand, 16 pairs of K by 16 tokens: the tiles'
// multiplies cost little beside the decoding, which each weight row gets once a step whatever
// the number of tokens. Measured the same way: 10%, 12-13% and 14-15% slower than dense at 1,
// 8 and 32 tokens. One token pays ~14% for it (32 rows decoded into a buffer the tiles then
// read, against four consumed from L1 by the dot products): the price of one path for every
// row count.
//
// Each output is one chain of tile multiplies over K's 32-value steps in order, from its own
// weight row and x row alone; tokens past m are zeros in B. So a row's result does not depend
// on how many rows share the call (speculative decoding and deterministic mode rely on it).
// A machine uses this path for every row count when it has the tiles, the dot products when
// it has not.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gemm_amx.h"
#include "row_decoder.h"

namespace edgefire::fused {

#if defined(__x86_64__)
constexpr int64_t kDecodedRows = 16;   // weight rows per A tile: a block, decoded together
constexpr int64_t kDecodedTokens = 16;  // x rows (tokens) per B tile: a group
constexpr int64_t kDecodedMaxRows = 4 * kDecodedTokens;  // C tiles 0-3

inline bool decoded_amx_takes(const RowDecoder& d, int64_t m) {
  return m <= kDecodedMaxRows && d.rows % kDecodedRows == 0 && d.cols % 32 == 0 &&
         amx_usable();
}

// Two blocks (A tiles 4, 6) against up to two groups (B tiles 5, 7): C tile 2g + block. Each
// x tile load serves two multiplies (the resident SmolLM2 above: 3-7% more tok/s at 1-32
// tokens than one block a pass).
__attribute__((target("amx-tile,amx-bf16"))) inline void decoded_two_blocks(
    const uint16_t* w, int64_t k, const uint16_t* xt, int64_t pairs, int64_t groups) {
  for (int64_t p = 0; p < pairs; p += kAmxPairs) {
    _tile_loadd(4, w + 2 * p, k * 2);
    _tile_loadd(6, w + kDecodedRows * k + 2 * p, k * 2);
    _tile_loadd(5, xt + p * 2 * kDecodedTokens, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 6, 5);
    if (groups > 1) {
      _tile_loadd(7, xt + (pairs + p) * 2 * kDecodedTokens, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 6, 7);
    }
  }
}

// One block (A tile 4) against up to four groups (B tiles 5 and 7 in turn): C tile g.
#define EDGEFIRE_DECODED_GROUP(G, B)                                  \
  if (groups > G) {                                                   \
    _tile_loadd(B, xt + ((G) * pairs + p) * 2 * kDecodedTokens, 64); \
    _tile_dpbf16ps(G, 4, B);                                          \
  }
__attribute__((target("amx-tile,amx-bf16"))) inline void decoded_one_block(
    const uint16_t* w, int64_t k, const uint16_t* xt, int64_t pairs, int64_t groups) {
  for (int64_t p = 0; p < pairs; p += kAmxPairs) {
    _tile_loadd(4, w + 2 * p, k * 2);
    EDGEFIRE_DECODED_GROUP(0, 5)
    EDGEFIRE_DECODED_GROUP(1, 7)
    EDGEFIRE_DECODED_GROUP(2, 5)
    EDGEFIRE_DECODED_GROUP(3, 7)
  }
}
#undef EDGEFIRE_DECODED_GROUP

// out [m, n] = x [m, k] @ w^T, w's rows from the decoder; x BF16 bits in natural column order.
__attribute__((target("amx-tile,amx-bf16"))) inline void gemm_decoded_amx(
    const RowDecoder& d, const uint16_t* x, int64_t m, float* out) {
  const int64_t n = d.rows, k = d.cols, pairs = k / 2;
  const int64_t groups = (m + kDecodedTokens - 1) / kDecodedTokens;
  // x as B tiles: per group of 16 tokens [k / 2][16][2], its columns in the decoder's order.
  std::vector<uint16_t> xt(groups * pairs * 2 * kDecodedTokens, 0);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t t = 0; t < kDecodedTokens && g * kDecodedTokens + t < m; ++t) {
      const uint16_t* row = x + (g * kDecodedTokens + t) * k;
      uint16_t* dst = xt.data() + g * pairs * 2 * kDecodedTokens + 2 * t;
      for (int64_t p = 0; p < pairs; ++p) {
        dst[p * 2 * kDecodedTokens] = row[d.order[2 * p]];
        dst[p * 2 * kDecodedTokens + 1] = row[d.order[2 * p + 1]];
      }
    }
  const int64_t blocks = n / kDecodedRows, per_item = groups <= 2 ? 2 : 1;
  at::parallel_for(0, (blocks + per_item - 1) / per_item, 1, [&](int64_t begin, int64_t end) {
    configure_tiles(kAmxRows);
    thread_local std::vector<uint16_t> store;
    store.resize(2 * kDecodedRows * k + 32);
    auto* w = reinterpret_cast<uint16_t*>(
        (reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
    alignas(64) float sums[kDecodedRows][kDecodedTokens];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b0 = item * per_item, count = std::min(per_item, blocks - b0);
      d.decode(d.self, b0 * kDecodedRows, count * kDecodedRows, w);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      if (count == 2)
        decoded_two_blocks(w, k, xt.data(), pairs, groups);
      else
        decoded_one_block(w, k, xt.data(), pairs, groups);
      for (int c = 0; c < 4; ++c) {
        const int64_t block = count == 2 ? c % 2 : 0, g = count == 2 ? c / 2 : c;
        if (g >= groups) continue;
        switch (c) {
          case 0: _tile_stored(0, sums, kDecodedTokens * 4); break;
          case 1: _tile_stored(1, sums, kDecodedTokens * 4); break;
          case 2: _tile_stored(2, sums, kDecodedTokens * 4); break;
          default: _tile_stored(3, sums, kDecodedTokens * 4); break;
        }
        // sums[weight row][token]: out is [token][weight row].
        float* o = out + (b0 + block) * kDecodedRows;
        for (int64_t t = 0; t < kDecodedTokens && g * kDecodedTokens + t < m; ++t)
          for (int64_t r = 0; r < kDecodedRows; ++r) o[(g * kDecodedTokens + t) * n + r] = sums[r][t];
      }
    }
  });
}
#else
inline bool decoded_amx_takes(const RowDecoder&, int64_t) { return false; }
inline void gemm_decoded_amx(const RowDecoder&, const uint16_t*, int64_t, float*) {}
#endif

}  // namespace edgefire::fused
