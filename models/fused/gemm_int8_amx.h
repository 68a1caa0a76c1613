// The INT8 matmul (gemv_int8.h) on AMX tiles (AMX-INT8), where the CPU has them and the kernel
// lets this process use them (gemm_amx.h's amx_usable).
//
// Why: the dot-product kernel multiplies two products a 32-bit lane per instruction, so past a
// few rows it is bound by the multiplies, not the read (2-core Xeon, ms a SmolLM2-INT8 step:
// 17.9 at 8 rows, 61.9 at 32, 117.8 at 64, where BF16 on tiles takes 30.3 at 32 and 54.6 at
// 64). A tile multiply does 16 x 16 x 64 byte products.
//
// How: x is rounded to 16-bit integers as the dot-product kernel rounds it (x_integers.h),
// and each word split into a signed high and an unsigned low byte, q = 256 hi + lo. The
// weight [n, k] is row-major, so 16 of its rows, 64 bytes of K each, load straight as a tile
// multiply's first operand; x's bytes are laid out once per call as the second (K in groups
// of four bytes, by 16 x rows), a 1 KiB tile per 64 values of K and plane. tdpbssd (w x hi)
// and tdpbsud (w x lo) sum over all of K in int32, exact for k up to kInt8AmxMaxK, and an
// output is (scale[n] * xscale[j]) * float(256 sum_hi + sum_lo), the exact integer total
// rounded once. So a row's result does not depend on the rows beside it, the thread or the
// tile arrangement: the step stays batch-invariant on these tiles at every row count.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gemm_amx.h"
#include "x_integers.h"

namespace edgefire::fused {

#if defined(__AVX512BW__) && defined(__AVX512DQ__)
constexpr int64_t kInt8AmxCols = 64;  // K bytes a tile row holds
constexpr int64_t kInt8AmxRows = 16;  // weight rows per tile; x rows per x tile
// A tile's int32 sums stay exact up to this K: 255 * 128 * k < 2^31 (the low bytes' sum).
constexpr int64_t kInt8AmxMaxK = 65536;
constexpr int64_t kInt8AmxPlane = kInt8AmxRows * kInt8AmxCols;  // bytes of one x tile
// Fewer x rows take the dot-product kernel, which reads a weight faster than 16-row tiles of
// mostly zeros multiply it. 2-core Xeon, SmolLM2's INT8 shapes streamed from memory, us a
// call on tiles against dot products: 4 rows, qkv 37.0/31.9 vs 35.4/26.2, o 25.5/24.1 vs
// 23.5/20.8; 5 rows, qkv 39.7/40.7 vs 45.5/50.2, gate_up 110.7/107.8 vs 137.9/133.6; 8 rows,
// qkv 37.1/38.9 vs 63.4/62.0. (A whole step at one row: 7.5-8.1 ms against 10.1-11.8 on
// tiles.) Both give the same bits, so a row's result does not depend on which ran it.
constexpr int64_t kInt8AmxFromRows = 5;

// AMX-INT8 (CPUID.7.0:EDX[25]) beside the tile state this process was granted.
inline bool amx_int8_usable() {
  static const bool usable = ((cpuid7_edx() >> 25) & 1) && amx_usable();
  return usable;
}

// r[i] (16 32-bit values each) -> r[j][i] = old r[i][j]: in-lane unpacks, then 128-bit lanes.
inline void transpose16x16(__m512i r[16]) {
  __m512i u[16];
  for (int b = 0; b < 16; b += 4) {
    const __m512i t0 = _mm512_unpacklo_epi32(r[b], r[b + 1]);
    const __m512i t1 = _mm512_unpackhi_epi32(r[b], r[b + 1]);
    const __m512i t2 = _mm512_unpacklo_epi32(r[b + 2], r[b + 3]);
    const __m512i t3 = _mm512_unpackhi_epi32(r[b + 2], r[b + 3]);
    u[b] = _mm512_unpacklo_epi64(t0, t2);  // per 128-bit lane: column 0 of rows b..b+3
    u[b + 1] = _mm512_unpackhi_epi64(t0, t2);
    u[b + 2] = _mm512_unpacklo_epi64(t1, t3);
    u[b + 3] = _mm512_unpackhi_epi64(t1, t3);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[i], u[4 + i], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(u[i], u[4 + i], 0xDD);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + i], u[12 + i], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + i], u[12 + i], 0xDD);
    r[i] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[4 + i] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[12 + i] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

// xq [m, k] 16-bit integers -> planes [groups of 16 rows][k / 64][hi, lo][16][64]: for each
// group and 64 values of K, two x tiles whose row q holds each x row's bytes 4q..4q+3 (rows
// past m are zeros).
inline void x_planes(const int16_t* xq, int64_t m, int64_t k, uint8_t* planes) {
  const __m512i low = _mm512_set1_epi16(0xFF);
  for (int64_t g0 = 0; g0 < m; g0 += kInt8AmxRows)
    for (int64_t c = 0; c < k; c += kInt8AmxCols) {
      __m512i hi[16], lo[16];
      for (int64_t j = 0; j < kInt8AmxRows; ++j) {
        if (g0 + j >= m) {
          hi[j] = lo[j] = _mm512_setzero_si512();
          continue;
        }
        const int16_t* row = xq + (g0 + j) * k + c;
        const __m512i a = _mm512_loadu_si512(row), b = _mm512_loadu_si512(row + 32);
        hi[j] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(a, 8))),
            _mm512_cvtepi16_epi8(_mm512_srai_epi16(b, 8)), 1);
        lo[j] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_and_si512(a, low))),
            _mm512_cvtepi16_epi8(_mm512_and_si512(b, low)), 1);
      }
      transpose16x16(hi);
      transpose16x16(lo);
      uint8_t* tile = planes + ((g0 / kInt8AmxRows) * (k / kInt8AmxCols) + c / kInt8AmxCols) *
                                   2 * kInt8AmxPlane;
      for (int q = 0; q < 16; ++q) {
        _mm512_storeu_si512(tile + q * kInt8AmxCols, hi[q]);
        _mm512_storeu_si512(tile + kInt8AmxPlane + q * kInt8AmxCols, lo[q]);
      }
    }
}

__attribute__((target("amx-tile,amx-int8"))) inline void configure_int8_tiles() {
  TileConfig config;
  for (int t = 0; t < 7; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  __asm__ volatile("ldtilecfg %0" : : "m"(config));  // as configure_tiles (gemm_amx.h) says
}

// The sums of 16 weight rows (n0..) against one group of 16 x rows (hi: `sums`, lo: `sums` +
// 256), [weight row][x row], into out: out[j, n0 + i] = (scale[i] * xscale[j]) * total.
inline void int8_amx_out(const int32_t* sums, const uint16_t* scales, const float* xscale,
                         int64_t rows, int64_t n0, float* out, int64_t n_out) {
  __m512i v[16];
  const __m512 xs = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << rows) - 1), xscale);
  for (int i = 0; i < 16; ++i) {
    const __m512i hi = _mm512_loadu_si512(sums + i * 16);
    const __m512i lo = _mm512_loadu_si512(sums + 256 + i * 16);
    auto total = [&](__m256i h, __m256i l) {  // 256 hi + lo, exactly, then rounded once
      return _mm512_cvtepi64_ps(_mm512_add_epi64(
          _mm512_slli_epi64(_mm512_cvtepi32_epi64(h), 8), _mm512_cvtepi32_epi64(l)));
    };
    const __m512 t = _mm512_insertf32x8(
        _mm512_castps256_ps512(total(_mm512_castsi512_si256(hi), _mm512_castsi512_si256(lo))),
        total(_mm512_extracti64x4_epi64(hi, 1), _mm512_extracti64x4_epi64(lo, 1)), 1);
    const __m512 s = _mm512_set1_ps(static_cast<float>(
        c10::BFloat16(scales[n0 + i], c10::BFloat16::from_bits())));
    v[i] = _mm512_castps_si512(_mm512_mul_ps(_mm512_mul_ps(s, xs), t));
  }
  transpose16x16(v);  // v[j]: x row j's 16 outputs
  for (int64_t j = 0; j < rows; ++j) _mm512_storeu_si512(out + j * n_out + n0, v[j]);
}

// x as xq [m, k] 16-bit integers with xscale [m], w [n, k] INT8, scales [n] BF16 bits, out
// [m, n]; k % 64 == 0, k <= kInt8AmxMaxK, n % 16 == 0. Threads split the weight's 16-row
// blocks; each block meets the x groups two at a time: four sum tiles (a group's hi and lo),
// the weight tile and two x tiles.
__attribute__((target("amx-tile,amx-int8"))) inline void gemm_int8_amx(
    const int16_t* xq, const float* xscale, int64_t m, int64_t k, const int8_t* w,
    const uint16_t* scales, int64_t n, float* out) {
  const int64_t groups = (m + kInt8AmxRows - 1) / kInt8AmxRows, steps = k / kInt8AmxCols;
  thread_local std::vector<uint8_t> store;
  store.resize(groups * steps * 2 * kInt8AmxPlane + 64);
  auto* planes = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
  x_planes(xq, m, k, planes);
  at::parallel_for(0, n / kInt8AmxRows, 1, [&](int64_t begin, int64_t end) {
    configure_int8_tiles();
    alignas(64) int32_t sums[2][2][256];  // [group of the pair][hi, lo][weight row x x row]
    for (int64_t b = begin; b < end; ++b) {
      const int8_t* wb = w + b * kInt8AmxRows * k;
      for (int64_t g = 0; g < groups; g += 2) {
        const bool two = g + 1 < groups;
        const uint8_t* p0 = planes + g * steps * 2 * kInt8AmxPlane;
        const uint8_t* p1 = p0 + steps * 2 * kInt8AmxPlane;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t s = 0; s < steps; ++s) {
          // A weight tile's 16 rows lie k bytes apart, which the hardware prefetcher does not
          // run ahead of: the first pass over a block asks for the next block, 1 KiB a step
          // in address order, so each block after a thread's first is in L2 when it comes.
          if (g == 0)
            for (int64_t line = 0; line < kInt8AmxPlane; line += 64)
              _mm_prefetch(reinterpret_cast<const char*>(wb + kInt8AmxRows * k) +
                               s * kInt8AmxPlane + line, _MM_HINT_T1);
          _tile_loadd(4, wb + s * kInt8AmxCols, k);
          _tile_loadd(5, p0 + s * 2 * kInt8AmxPlane, kInt8AmxCols);
          _tile_dpbssd(0, 4, 5);
          _tile_loadd(6, p0 + (s * 2 + 1) * kInt8AmxPlane, kInt8AmxCols);
          _tile_dpbsud(1, 4, 6);
          if (two) {
            _tile_loadd(5, p1 + s * 2 * kInt8AmxPlane, kInt8AmxCols);
            _tile_dpbssd(2, 4, 5);
            _tile_loadd(6, p1 + (s * 2 + 1) * kInt8AmxPlane, kInt8AmxCols);
            _tile_dpbsud(3, 4, 6);
          }
        }
        _tile_stored(0, sums[0][0], 64);
        _tile_stored(1, sums[0][1], 64);
        if (two) {
          _tile_stored(2, sums[1][0], 64);
          _tile_stored(3, sums[1][1], 64);
        }
        for (int64_t h = 0; h < (two ? 2 : 1); ++h) {
          const int64_t r0 = (g + h) * kInt8AmxRows;
          int8_amx_out(sums[h][0], scales, xscale + r0, std::min(kInt8AmxRows, m - r0),
                       b * kInt8AmxRows, out + r0 * n, n);
        }
      }
    }
  });
}
#endif

}  // namespace edgefire::fused
