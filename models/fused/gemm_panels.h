// BF16 matmul for prompt-sized steps on AVX2 (no AVX-512): out[m, n] = x[m, k] @ w^T, the
// weight packed in panels of 16 output columns ([n / 16][k][16]), x widened to float32 once per
// call, float32 accumulated and out.
//
// Why: gemv.h's tiles hold a vector of partial sums along K per (weight row, x row), so every
// FMA needs both sides widened from BF16 in registers; on AVX2 those widenings share the vector
// ports with the FMAs, and the tiles stop at ~60% of the FMA peak at every row count (Zen 4
// with AVX-512 hidden, 2 cores: 105-112 of 176 GFLOP/s at 32-256 rows), below torch's float32
// GEMM at prompt sizes (124-152). Here a 6-row x 16-column tile keeps 12 sums in registers and
// per K value widens one panel row (two vectors) for 12 FMAs against x broadcast from memory:
// 143-158 GFLOP/s at 256-1,024 rows.
//
// Each output is one chain of FMAs over K in order, whatever the rows of x, the tile or the
// thread computing it: a prompt row's result does not depend on what shares its step.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../simd.h"

namespace edgefire::fused {

constexpr int64_t kPanelCols = 16;  // output columns per panel: two AVX2 vectors

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
constexpr bool kHasPanels = true;
// x rows per tile: 12 sums, a panel row's 2 vectors and a broadcast take 15 of AVX2's 16
// registers.
constexpr int64_t kPanelRows = 6;
// x rows per block: a block (float32) stays in L2 while every panel of a thread's share passes
// over it.
constexpr int64_t kPanelBlockBytes = 256 << 10;

template <int MR>
inline void panel_tile(const float* x, int64_t k, const uint16_t* panel, float* out, int64_t n) {
  __m256 acc[MR][2];
  // Unrolled so that GCC keeps the sums in registers (otherwise it stores them every K).
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m256 w0 = simd::vload_bf16(panel + p * kPanelCols);
    const __m256 w1 = simd::vload_bf16(panel + p * kPanelCols + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * k + p);
      acc[r][0] = _mm256_fmadd_ps(w0, xb, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, xb, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(out + r * n, acc[r][0]);
    _mm256_storeu_ps(out + r * n + 8, acc[r][1]);
  }
}

inline void panel_rows(int64_t mr, const float* x, int64_t k, const uint16_t* panel, float* out,
                       int64_t n) {
  switch (mr) {
    case 6: panel_tile<6>(x, k, panel, out, n); break;
    case 5: panel_tile<5>(x, k, panel, out, n); break;
    case 4: panel_tile<4>(x, k, panel, out, n); break;
    case 3: panel_tile<3>(x, k, panel, out, n); break;
    case 2: panel_tile<2>(x, k, panel, out, n); break;
    default: panel_tile<1>(x, k, panel, out, n); break;
  }
}

// x [m, k] BF16 bits, panels [n / 16][k][16] BF16 bits (pack_panels in llama_decode.py), out
// [m, n] float32. Threads split the panels; each passes its share over x a block of rows at a
// time.
inline void gemm_panels_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* panels,
                             int64_t n, float* out) {
  thread_local std::vector<float> widened;  // grows to the largest step's
  widened.resize(m * k);
  float* xf = widened.data();
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * k; i < end * k; i += simd::kWidth)
      simd::vstore(xf + i, simd::vload_bf16(x + i));
  });
  const int64_t block_rows =
      std::max(kPanelRows, kPanelBlockBytes / (k * 4) / kPanelRows * kPanelRows);
  at::parallel_for(0, n / kPanelCols, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = 0; r0 < m; r0 += block_rows) {
      const int64_t r1 = std::min(m, r0 + block_rows);
      for (int64_t b = begin; b < end; ++b)
        for (int64_t r = r0; r < r1; r += kPanelRows)
          panel_rows(std::min(kPanelRows, r1 - r), xf + r * k, k, panels + b * k * kPanelCols,
                     out + r * n + b * kPanelCols, n);
    }
  });
}
#else
constexpr bool kHasPanels = false;

// Never reached: Proj::set_packed and linear_panels refuse panels where kHasPanels is false.
inline void gemm_panels_bf16(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t,
                             float*) {
  TORCH_CHECK(false, "BF16 panels are the AVX2 build's (without AVX-512)");
}
#endif

}  // namespace edgefire::fused
