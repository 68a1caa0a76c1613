// Decode-sized matmuls: out[m, n] = sum_k x[m, k] * w[n, k] for a few rows of x (a decode
// step's tokens), float32 accumulated and out; w in BF16 (x in BF16). (INT8: gemv_int8.h;
// INT4: gemv_int4.h.)
//
// At a few rows a projection is a read of its weight: each 32-value chunk of a weight
// row is loaded once and multiplied into every x row by one AVX512-BF16 dot-product
// instruction (without those, AVX-512 or AVX2: widened to float32 in registers, then FMA). Four weight rows per tile keep 4 x 4 accumulators in registers, and the four
// row sums are reduced together (one horizontal-add tree instead of four). Measured on
// SmolLM2-135M's shapes, 2 cores: one row reads the weights at the machine's measured read
// bandwidth, where torch's BF16 matmul (oneDNN) reads them at 40% of it (bench/kernels.py).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../simd.h"

namespace edgefire::fused {

constexpr int64_t kTileRows = 4;  // weight rows per tile
constexpr int64_t kChunk = 32;    // K must be a multiple: one dot-product instruction's width
// Rows read in turn ask for the weight this many values (8 KiB) ahead into L2. The hardware
// prefetcher alone leaves a core's stream waiting on memory: on a 2-core Xeon (Sapphire
// Rapids class) one x row read SmolLM2's shapes at 20-23 GB/s without it, 24-27 with it
// (2, 4 and 8 KiB ahead into L1 or L2 measured; 8 KiB into L2 the fastest).
constexpr int64_t kStreamAhead = 4096;

#if defined(EDGEFIRE_SIMD)
using namespace edgefire::simd;
#endif

#if defined(__AVX512BF16__)
constexpr const char* kIsa = "avx512bf16";
constexpr int64_t kTileTokens = 4;  // x rows per tile: 4 x 4 accumulators in registers

// Rows [n0, n0 + 4) of the weight against MB rows of x. InTurn walks the four rows one after
// the other; otherwise a 32-value chunk of each row at a time. Both sum each row's products in
// the same order, so a row's result is the same either way (the fused step's rows must not
// depend on what shares their step: speculative decoding relies on it).
//
// Why both: with one or two x rows, reading one weight row at a time streams from memory at
// 1.3-1.9x the rate of four rows side by side (Zen 4, 2 cores: 26-37 against 19-24 GB/s on
// SmolLM2's shapes), which keeps the hardware prefetcher on one stream. From three x rows the
// side-by-side order's 4 x MB independent accumulators pay (its dot products are no longer
// waiting on each other), and it is the faster one.
template <int MB, bool InTurn = false>
inline void tile(const uint16_t* x, const uint16_t* w, int64_t k, int64_t n0, float* out,
                 int64_t n_out) {
  __m512 acc[kTileRows][MB];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  auto step = [&](int i, int64_t c) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + (n0 + i) * k + c);
    for (int j = 0; j < MB; ++j)
      acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, (__m512bh)_mm512_loadu_si512(x + j * k + c));
  };
  if constexpr (InTurn) {
    for (int i = 0; i < kTileRows; ++i)
      for (int64_t c = 0; c < k; c += kChunk) {
        _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + i) * k + c + kStreamAhead),
                     _MM_HINT_T1);
        step(i, c);
      }
  } else {
    for (int64_t c = 0; c < k; c += kChunk)
      for (int i = 0; i < kTileRows; ++i) {
        // The next tile's rows are streamed in while this one is multiplied.
        _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + i + kTileRows) * k + c),
                     _MM_HINT_T0);
        step(i, c);
      }
  }
  for (int j = 0; j < MB; ++j)
    _mm_storeu_ps(out + j * n_out + n0, reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
}
constexpr int64_t kInTurnTokens = 2;  // up to this many x rows: rows in turn (see tile)
#elif defined(EDGEFIRE_SIMD)
// Without BF16 dot products both sides are widened to float32 in registers (x once per chunk
// for all four weight rows) and multiplied with FMA. On AVX2 (16 registers) three x rows per
// tile keep the 12 accumulators, the x chunks and a weight chunk in registers.
constexpr const char* kIsa = kWidth == 16 ? "avx512" : "avx2";
constexpr int64_t kTileTokens = kWidth == 16 ? 4 : 3;

template <int MB>
inline void tile(const uint16_t* x, const uint16_t* w, int64_t k, int64_t n0, float* out,
                 int64_t n_out) {
  vf acc[kTileRows][MB];
  for (auto& row : acc)
    for (auto& a : row) a = vzero();
  for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
    for (int i = 0; i < kTileRows; ++i)
      _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + i + kTileRows) * k + c0), _MM_HINT_T0);
    for (int64_t c = c0; c < c0 + kChunk; c += kWidth) {
      vf xv[MB];
      for (int j = 0; j < MB; ++j) xv[j] = vload_bf16(x + j * k + c);
      for (int i = 0; i < kTileRows; ++i) {
        const vf wv = vload_bf16(w + (n0 + i) * k + c);
        for (int j = 0; j < MB; ++j) acc[i][j] = vfmadd(wv, xv[j], acc[i][j]);
      }
    }
  }
  for (int j = 0; j < MB; ++j)
    _mm_storeu_ps(out + j * n_out + n0, reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
}
#else
constexpr const char* kIsa = "scalar";
constexpr int64_t kTileTokens = 4;

inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

template <int MB>
inline void tile(const uint16_t* x, const uint16_t* w, int64_t k, int64_t n0, float* out,
                 int64_t n_out) {
  for (int i = 0; i < kTileRows; ++i)
    for (int j = 0; j < MB; ++j) {
      float acc = 0.f;
      for (int64_t c = 0; c < k; ++c) acc += widen(w[(n0 + i) * k + c]) * widen(x[j * k + c]);
      out[j * n_out + n0 + i] = acc;
    }
}
#endif

// f(std::integral_constant<int, mb>) for mb in 1..4: a kernel's row count as a template
// argument.
template <typename F>
inline void with_rows(int64_t mb, F f) {
  switch (mb) {
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

// Runs tile_for(MB, x row offset, n0) over every 4-row tile of the weight and every group of up
// to kTileTokens x rows, the weight's tiles split between the threads: each thread reads its
// part of the weight once, multiplying it into all rows of x.
template <typename TileFor>
inline void over_tiles(int64_t m, int64_t n, TileFor tile_for) {
  at::parallel_for(0, n / kTileRows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kTileRows;
      for (int64_t m0 = 0; m0 < m; m0 += kTileTokens)
        tile_for(std::min<int64_t>(kTileTokens, m - m0), m0, n0);
    }
  });
}

// x [m, k] and w [n, k] as BF16 bits, out [m, n] float32; n % 4 == 0, k % 32 == 0.
inline void gemv_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                      float* out) {
#if defined(__AVX512BF16__)  // measured there only (tile says why)
  if (m <= kInTurnTokens) {
    over_tiles(m, n, [&](int64_t mb, int64_t, int64_t n0) {
      if (mb == 2) tile<2, true>(x, w, k, n0, out, n);
      else tile<1, true>(x, w, k, n0, out, n);
    });
    return;
  }
#endif
  over_tiles(m, n, [&](int64_t mb, int64_t m0, int64_t n0) {
    with_rows(mb, [&](auto rows) { tile<rows()>(x + m0 * k, w, k, n0, out + m0 * n, n); });
  });
}

}  // namespace edgefire::fused
