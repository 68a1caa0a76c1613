// The INT8 matmul (gemv_int8.h) over a weight packed as pairs, as gemm_packed.h packs BF16:
// [n / 64][k / 2][64][2] INT8, so one dot-product instruction multiplies 16 columns' pair of
// K by one x pair broadcast from memory, here in 16-bit integers (vpdpwssd).
//
// Why: the row-major integer tiles (tile_int8_q16) load an x vector for every dot product
// and reduce each (weight row, x row)'s lanes at the end, so past a few rows they wait on
// loads: on a 2-core Zen 4 a SmolLM2-INT8 step cost more than the BF16 one from 8 rows on
// (59.5 against 31.9 ms at 32 rows), its integer kernels at 136-268 GFLOP/s where the BF16
// pairs reached 317-377 (bench/results/steps-avx512bf16.json, kernels.json). A 6-row x
// 64-column tile here keeps 24 sums in registers for 4 weight loads (32 bytes each,
// sign-extended to words) and 6 broadcasts, as the BF16 pairs do, over half their bytes.
//
// The same integers as the row-major tiles: x rounded by quantize_rows, each output's
// products summed exactly. A lane sums two products a pair of K, at most 128 * 32767 each,
// so kInt8PairSpan columns stay inside int32; the lanes are then added into int64 totals, and
// an output is (scale[n] * xscale[j]) * float(total), the same operations as
// tile_int8_q16's. So a row's result is the same bits on either kernel, whatever shares its
// step.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "gemm_packed.h"
#include "x_integers.h"

namespace edgefire::fused {

#if defined(__AVX512BW__) && defined(__AVX512DQ__)
constexpr bool kHasPackedInt8 = true;
// Columns of K a lane sums in int32 before its int64 total takes it: 512 * 128 * 32767 < 2^31.
constexpr int64_t kInt8PairSpan = 512;
constexpr int64_t kInt8LinesPerPair = 2;  // a block's pair of K: 64 columns x 2 bytes
// From this many x rows the packed tiles take INT8 matmuls (gemv_int8). 2-core Zen 4,
// SmolLM2's shapes streamed from memory, GB/s on the row-major tiles against the packed ones,
// three runs each: one row 28.2-38.0 against 27.6-34.2 (the row-major a little ahead on
// three shapes of four), two rows 20.5-36.2 against 23.4-38.0 (the packed ahead on all four
// in most runs); from four rows the packed tiles multiply at 1.4-2x the row-major's rate.
constexpr int64_t kInt8PackedFromRows = 2;

// Pairs [p0, p1) of one packed block [k / 2][64][2] INT8 against rows [0, MR) of xq (16-bit
// integers), at most kInt8PairSpan / 2 pairs: the int32 sums added into totals [MR][64]
// (int64).
template <int MR>
inline void packed_int8_span(const int16_t* xq, int64_t ldx, const int8_t* block, int64_t p0,
                             int64_t p1, const char* ahead, int64_t lines, int64_t* totals) {
  Sums16 acc[MR][4];
  for (auto& row : acc)
    for (auto& a : row) a = Sums16{};
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* wp = block + p * kPackedCols * 2;
    for (int64_t line = 0; line < lines; ++line)
      _mm_prefetch(ahead + (p * lines + line) * 64, _MM_HINT_T1);
    __m512i w[4];
    for (int j = 0; j < 4; ++j)
      w[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + j * 32)));
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, xq + r * ldx + 2 * p, 4);
      const __m512i xb = _mm512_set1_epi32(pair);
      for (int j = 0; j < 4; ++j) acc[r][j] = dot_words(acc[r][j], w[j], xb);
    }
  }
  auto add = [](int64_t* t, __m256i lanes) {
    _mm512_store_si512(t, _mm512_add_epi64(_mm512_load_si512(t), _mm512_cvtepi32_epi64(lanes)));
  };
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) {
      int64_t* t = totals + r * kPackedCols + j * 16;
      add(t, _mm512_castsi512_si256((__m512i)acc[r][j]));
      add(t + 8, _mm512_extracti64x4_epi64((__m512i)acc[r][j], 1));
    }
}

// Rows [0, MR) of xq (scales xscale) against one packed block, its 64 columns' BF16 scales at
// `scales`: out[r, 0..64). Each pair of K also asks for `lines` cache lines from `ahead` on,
// as the BF16 pairs' tile does (gemm_packed.h).
template <int MR>
inline void packed_int8_tile(const int16_t* xq, int64_t ldx, const float* xscale,
                             const int8_t* block, int64_t pairs, const uint16_t* scales,
                             float* out, int64_t ldo, const char* ahead, int64_t lines) {
  alignas(64) int64_t totals[MR * kPackedCols] = {};
  for (int64_t p0 = 0; p0 < pairs; p0 += kInt8PairSpan / 2)
    packed_int8_span<MR>(xq, ldx, block, p0, std::min(pairs, p0 + kInt8PairSpan / 2), ahead,
                         lines, totals);
  for (int j = 0; j < 4; ++j) {
    const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + j * 16))),
        16));
    for (int r = 0; r < MR; ++r) {
      const int64_t* t = totals + r * kPackedCols + j * 16;
      const __m512 sums = _mm512_insertf32x8(
          _mm512_castps256_ps512(_mm512_cvtepi64_ps(_mm512_load_si512(t))),
          _mm512_cvtepi64_ps(_mm512_load_si512(t + 8)), 1);
      _mm512_storeu_ps(out + r * ldo + j * 16,
                       _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(xscale[r])), sums));
    }
  }
}

// xq [m, k] as 16-bit integers with their row scales (quantize_rows), packed [n / 64][k / 2]
// [64][2] INT8 (pack_pairs in llama_decode.py), scales [n] BF16 bits, out [m, n] float32;
// k % 64 == 0 (as the row-major integer tiles take it).
inline void gemm_packed_int8(const int16_t* xq, const float* xscale, int64_t m, int64_t k,
                             const int8_t* packed, const uint16_t* scales, int64_t n,
                             float* out) {
  const int64_t pairs = k / 2;
  over_packed_tiles(
      m, n, pairs, reinterpret_cast<const char*>(packed), pairs * kPackedCols * 2,
      kInt8LinesPerPair,
      [&](int64_t mr, int64_t r, int64_t b, const char* block, const char* ahead,
          int64_t lines) {
        const auto* w = reinterpret_cast<const int8_t*>(block);
        const uint16_t* s = scales + b * kPackedCols;
        float* o = out + r * n + b * kPackedCols;
        const int16_t* x = xq + r * k;
        switch (mr) {
          case 6: packed_int8_tile<6>(x, k, xscale + r, w, pairs, s, o, n, ahead, lines); break;
          case 5: packed_int8_tile<5>(x, k, xscale + r, w, pairs, s, o, n, ahead, lines); break;
          case 4: packed_int8_tile<4>(x, k, xscale + r, w, pairs, s, o, n, ahead, lines); break;
          case 3: packed_int8_tile<3>(x, k, xscale + r, w, pairs, s, o, n, ahead, lines); break;
          case 2: packed_int8_tile<2>(x, k, xscale + r, w, pairs, s, o, n, ahead, lines); break;
          default: packed_int8_tile<1>(x, k, xscale + r, w, pairs, s, o, n, ahead, lines); break;
        }
      });
}
#else
constexpr bool kHasPackedInt8 = false;
#endif

}  // namespace edgefire::fused
