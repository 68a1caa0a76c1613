// Decode-sized BF16 matmul: out[m, n] = sum_k x[m, k] * w[n, k] for a few rows of x (a decode
// step's tokens), BF16 in, float32 accumulated and out.
//
// At one to eight rows a projection is a read of its weight: each 32-value chunk of a weight
// row is loaded once and multiplied into every x row by one AVX512-BF16 dot-product
// instruction. Four weight rows per tile keep 4 x 4 accumulators in registers, and the four
// row sums are reduced together (one horizontal-add tree instead of four). Measured on
// SmolLM2-135M's shapes, 2 cores: one row reads the weights at the machine's measured read
// bandwidth, where torch's BF16 matmul (oneDNN) reads them at 40% of it (bench/kernels.py).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace edgefire::fused {

constexpr int64_t kTileRows = 4;  // weight rows per tile
constexpr int64_t kChunk = 32;    // K must be a multiple: one dot-product instruction's width

#if defined(__AVX512BF16__)
constexpr bool kNativeDot = true;

inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  auto fold = [](__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  };
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(fold(a0), fold(a1)),
                                  _mm256_hadd_ps(fold(a2), fold(a3)));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Rows [n0, n0 + 4) of the weight against MB rows of x.
template <int MB>
inline void tile(const uint16_t* x, const uint16_t* w, int64_t k, int64_t n0, float* out,
                 int64_t n_out) {
  __m512 acc[kTileRows][MB];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; c += kChunk) {
    for (int i = 0; i < kTileRows; ++i) {
      // The next tile's rows are streamed in while this one is multiplied.
      _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + i + kTileRows) * k + c), _MM_HINT_T0);
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + (n0 + i) * k + c);
      for (int j = 0; j < MB; ++j)
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, (__m512bh)_mm512_loadu_si512(x + j * k + c));
    }
  }
  for (int j = 0; j < MB; ++j)
    _mm_storeu_ps(out + j * n_out + n0, reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
}
#else
constexpr bool kNativeDot = false;

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

// x [m, k] and w [n, k] as BF16 bits, out [m, n] float32; n % 4 == 0, k % 32 == 0. Splits the
// weight's rows between the threads, each reading its part of the weight once.
inline void gemv_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                      float* out) {
  at::parallel_for(0, n / kTileRows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kTileRows;
      int64_t m0 = 0;
      for (; m0 + 4 <= m; m0 += 4) tile<4>(x + m0 * k, w, k, n0, out + m0 * n, n);
      switch (m - m0) {
        case 3: tile<3>(x + m0 * k, w, k, n0, out + m0 * n, n); break;
        case 2: tile<2>(x + m0 * k, w, k, n0, out + m0 * n, n); break;
        case 1: tile<1>(x + m0 * k, w, k, n0, out + m0 * n, n); break;
        default: break;
      }
    }
  });
}

}  // namespace edgefire::fused
