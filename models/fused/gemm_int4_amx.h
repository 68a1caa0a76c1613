// The INT4 matmul's integer path (gemv_int4_q16.h) on AMX tiles (AMX-INT8), where the CPU has
// them and the kernel lets this process use them (gemm_amx.h's amx_usable).
//
// Why: past a few rows the dot-product blocks are bound by widening the nibbles and their
// multiply-adds, not by the read (2-core Xeon, ms a SmolLM2-INT4 step at 32 and 64 rows:
// 46.3-61.6 and 84.7-113.6, where INT8 on tiles took 30.5-33.2 and 55.3-61.8; a 385-token
// prompt 486-797 tok/s against INT8's 1,728-2,316).
//
// How: x is rounded to 16-bit integers as the dot-product blocks round it (x_integers.h), each
// word split into a signed high and an unsigned low byte, q16 = 256 hi + lo, laid out as two
// byte planes [rows, k] (rows padded to 16 with zeros): 16 rows by 32 columns of a plane load
// straight as a tile multiply's first operand. A 16-row slice of the weight's nibbles (torch's
// AVX-512 packing, gemv_int4.h) is spread once into the second operand's layout (K in fours
// by 16 rows), one byte permutation and a mask per 64 bytes. A multiply covers 32 columns, so
// every group (32, 64, ... columns) sums in tiles of its own: tdpbsud (hi x q) and tdpbuud (lo
// x q) give each (x row, weight row) its group total exactly in int32, 256 sum_hi + sum_lo =
// the dot-product blocks' total. It is scaled in by the same float operations in the same
// group order, then multiplied by x's scale, as there: the outputs are theirs, bit for bit, so
// a row's result does not depend on how many rows share the step nor on which kernel ran it.
//
// The group's sums leave the tiles through memory (a tile store, then vector loads): each
// group's multiply runs while the group before is stored and the one before that is scaled
// in, since a load right after the tile store of its bytes waits for it (2-core Xeon, 30
// layers of SmolLM2's INT4 shapes, ms at 64 rows: 36 with the next group only, 26 so).
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../simd.h"
#include "gemm_int8_amx.h"

namespace edgefire::fused {

#if defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VBMI__)
#define EDGEFIRE_INT4_AMX 1
constexpr int64_t kInt4AmxRows = 16;  // x rows per x tile; weight rows per weight tile
constexpr int64_t kInt4AmxCols = 32;  // columns of K per multiply: the smallest group
// Fewer x rows take the dot-product blocks, which give the same bits. A tile pass costs the
// same for 1 to 16 rows. 2-core Xeon, ms for 30 layers of SmolLM2's INT4 shapes (weights
// streamed), tiles against dot products: 8 rows 6.3 vs 5.0, 10 7.1 vs 6.0, 14 7.8 vs 7.9, 16
// 7.7-8.1 vs 8.6-9.6, 32 13.3 vs 17.9, 64 25.2 vs 35.8, 256 91.6 vs 138.3.
constexpr int64_t kInt4AmxFromRows = 16;

// Tiles: 0-3 two sets of a group's int32 sums (hi, lo) [16 x rows][16 weight rows], 4 and 5
// the x planes (hi, lo) [16 rows][32 bytes], 6 and 7 two weight tiles [8 fours of K][16 rows x
// 4 bytes]. Tiles are not renamed: with two sets a group multiplies while the one before is
// stored.
__attribute__((target("amx-tile,amx-int8"))) inline void configure_int4_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = t == 4 || t == 5 ? kInt4AmxCols : 64;
    config.rows[t] = t >= 6 ? kInt4AmxCols / 4 : kInt4AmxRows;
  }
  __asm__ volatile("ldtilecfg %0" : : "m"(config));  // as configure_tiles (gemm_amx.h) says
}

// Byte indices into two columns' pairs (128 bytes: four columns of 32): output byte 4i + t is
// column t's byte half * 16 + i, so the 64 bytes are 16 rows' four columns each.
inline __m512i fours_index(int half) {
  alignas(64) int8_t index[64];
  for (int i = 0; i < 16; ++i)
    for (int t = 0; t < 4; ++t) index[4 * i + t] = static_cast<int8_t>(32 * t + 16 * half + i);
  return _mm512_load_si512(index);
}

// Rows 16s.. of a 64-row block (wb, torch's AVX-512 packing: 32 bytes a column, byte d row
// d's low nibble and row d + 32's high one) over k columns, as weight tiles: 64 bytes per four
// columns (16 rows' four nibbles each), 512 bytes a tile of 32 columns.
inline void weight_fours(const uint8_t* wb, int64_t k, int s, uint8_t* tiles) {
  const __m512i index = fours_index(s % 2), nibble = _mm512_set1_epi8(0xF);
  for (int64_t c = 0; c < k; c += 4) {
    const uint8_t* four = wb + c * 32;
    __m512i q = _mm512_permutex2var_epi8(_mm512_loadu_si512(four), index,
                                         _mm512_loadu_si512(four + 64));
    if (s >= 2) q = _mm512_srli_epi16(q, 4);
    _mm512_store_si512(tiles + c * 16, _mm512_and_si512(q, nibble));
  }
}

// xq [m, k] -> hi and lo planes [m rounded up to 16, k], the padding rows zero.
inline void int4_x_planes(const int16_t* xq, int64_t m, int64_t k, int8_t* hi, uint8_t* lo) {
  const int64_t padded = (m + kInt4AmxRows - 1) / kInt4AmxRows * kInt4AmxRows;
  const __m512i low = _mm512_set1_epi16(0xFF);
  for (int64_t i = 0; i < m * k; i += 32) {
    const __m512i v = _mm512_loadu_si512(xq + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i),
                        _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i),
                        _mm512_cvtepi16_epi8(_mm512_and_si512(v, low)));
  }
  std::fill(hi + m * k, hi + padded * k, 0);
  std::fill(lo + m * k, lo + padded * k, 0);
}

// The integer path's operands (gemv_int4's: xq [m, k], xscale [m], xqsum [m, k / group]) against
// w in 64-row blocks, scales_zeros [k / group, n, 2] BF16 bits; out [m, n]. k % 32 == 0,
// group % 32 == 0 and at most 256 (each group's int32 totals stay exact), n % 64 == 0.
// Threads split the 16-row slices. A slice's weight is spread into tiles once; each group of
// 16 x rows then walks K's groups, its 16 outputs held in registers.
__attribute__((target("amx-tile,amx-int8"))) inline void gemm_int4_amx(
    const int16_t* xq, const float* xscale, const float* xqsum, int64_t m, int64_t k,
    int64_t group, const uint8_t* w, const uint16_t* scales_zeros, int64_t n, float* out) {
  const int64_t groups = k / group, padded = (m + kInt4AmxRows - 1) / kInt4AmxRows * kInt4AmxRows;
  thread_local std::vector<uint8_t> planes;  // hi, then lo
  planes.resize(2 * padded * k);
  auto* hi = reinterpret_cast<int8_t*>(planes.data());
  uint8_t* lo = planes.data() + padded * k;
  int4_x_planes(xq, m, k, hi, lo);
  at::parallel_for(0, n / kInt4AmxRows, 1, [&](int64_t begin, int64_t end) {
    configure_int4_tiles();
    thread_local std::vector<uint8_t> store;  // the slice's weight tiles, K in order
    store.resize(k * kInt4AmxRows + 64);
    auto* tiles = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
    alignas(64) int32_t sums[3][2][kInt4AmxRows * kInt4AmxRows];  // [g % 3][hi, lo]
    for (int64_t slice = begin; slice < end; ++slice) {
      const int64_t n0 = slice * kInt4AmxRows;
      weight_fours(w + (slice / 4) * 64 * k / 2, k, static_cast<int>(slice % 4), tiles);
      for (int64_t r0 = 0; r0 < m; r0 += kInt4AmxRows) {
        __m512 acc[kInt4AmxRows];
        for (auto& a : acc) a = _mm512_setzero_ps();
        auto multiply = [&](int64_t g) {
          for (int64_t c = g * group; c < (g + 1) * group; c += kInt4AmxCols) {
            const int64_t at = r0 * k + c;
            _tile_loadd(4, hi + at, k);
            _tile_loadd(5, lo + at, k);
            // GCC's tile intrinsics paste their tile numbers into the instruction's text, so
            // the two sets (sums SUM_HI, SUM_LO; weight tile W) are one macro body.
#define EDGEFIRE_INT4_MULTIPLY(SUM_HI, SUM_LO, W)     \
  if (c == g * group) {                               \
    _tile_zero(SUM_HI);                               \
    _tile_zero(SUM_LO);                               \
  }                                                   \
  _tile_loadd(W, tiles + c * kInt4AmxRows, 64);       \
  _tile_dpbsud(SUM_HI, 4, W);                         \
  _tile_dpbuud(SUM_LO, 5, W);
            if (g % 2 == 0) {
              EDGEFIRE_INT4_MULTIPLY(0, 1, 6)
            } else {
              EDGEFIRE_INT4_MULTIPLY(2, 3, 7)
            }
#undef EDGEFIRE_INT4_MULTIPLY
          }
        };
        auto keep = [&](int64_t g) {
          int32_t(&to)[2][kInt4AmxRows * kInt4AmxRows] = sums[g % 3];
          if (g % 2 == 0) {
            _tile_stored(0, to[0], 64);
            _tile_stored(1, to[1], 64);
          } else {
            _tile_stored(2, to[0], 64);
            _tile_stored(3, to[1], 64);
          }
        };
        const int64_t rows = std::min(kInt4AmxRows, m - r0);
        auto scale_in = [&](int64_t g) {
          const int set = static_cast<int>(g % 3);
          vf scale, zero;
          vload_bf16_pairs(scales_zeros + (g * n + n0) * 2, scale, zero);
          const vf offset = vsub(zero, vmul(vset1(8.f), scale));
          for (int64_t j = 0; j < kInt4AmxRows; ++j) {
            if (j == rows) break;  // the padding rows' sums are not needed
            const __m512i total = _mm512_add_epi32(
                _mm512_slli_epi32(_mm512_load_si512(sums[set][0] + j * kInt4AmxRows), 8),
                _mm512_load_si512(sums[set][1] + j * kInt4AmxRows));
            acc[j] = vfmadd(_mm512_cvtepi32_ps(total), scale,
                            vfmadd(offset, vset1(xqsum[(r0 + j) * groups + g]), acc[j]));
          }
        };
        // Group g multiplies while g - 1's sums are stored and g - 2's scaled in: a load
        // right after a tile store of the same bytes waits for it.
        for (int64_t g = 0; g < groups + 2; ++g) {
          if (g < groups) multiply(g);
          if (g >= 1 && g <= groups) keep(g - 1);
          if (g >= 2) scale_in(g - 2);
        }
        for (int64_t j = 0; j < rows; ++j)
          vstore(out + (r0 + j) * n + n0, vmul(acc[j], vset1(xscale[r0 + j])));
      }
    }
  });
}
#endif

}  // namespace edgefire::fused
