// x rows as 16-bit integers for the INT8 and INT4 kernels' integer paths (gemv_int8.h,
// gemv_int4.h): each row rounded against its own largest value, x ~ scale * q, so a weight's
// small integers multiply into it exactly in int32, two products a lane.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>

#include "../simd.h"

namespace edgefire::fused {

#if defined(__AVX512BW__)
using namespace edgefire::simd;

// acc + a[2i] * b[2i] + a[2i + 1] * b[2i + 1] in each 32-bit lane i, a and b 16-bit integers.
inline __m512i dot_words(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

// x [m, k] BF16 -> xq [m, k] 16-bit integers, rounded to nearest, and xscale [m]:
// x[r, c] ~ xscale[r] * xq[r, c]; k % 16 == 0. The largest |xq| is cut so that a lane's sum of
// k / 16 products with INT8 weights (|w| <= 128) stays inside int32 (INT4's 4-bit
// weights sum fewer, smaller products between flushes).
inline void quantize_rows(const c10::BFloat16* x, int64_t m, int64_t k, int16_t* xq,
                          float* xscale) {
  const float top = static_cast<float>(std::min<int64_t>(32767, INT_MAX / (128 * (k / 16))));
  const auto* bits = reinterpret_cast<const uint16_t*>(x);
  for (int64_t r = 0; r < m; ++r) {
    const uint16_t* row = bits + r * k;
    __m512 largest = _mm512_setzero_ps();
    __mmask16 nan = 0;  // a NaN in x makes the row's outputs NaN, as a float product would
    for (int64_t c = 0; c < k; c += 16) {
      const __m512 v = vload_bf16(row + c);
      largest = _mm512_max_ps(largest, vabs(v));
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    const float most = _mm512_reduce_max_ps(largest);
    const __m512 inv = _mm512_set1_ps(most > 0.f ? top / most : 0.f);
    xscale[r] = nan ? std::numeric_limits<float>::quiet_NaN() : most / top;
    for (int64_t c = 0; c < k; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + r * k + c),
                          _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(
                              _mm512_mul_ps(vload_bf16(row + c), inv))));
  }
}
#endif

}  // namespace edgefire::fused
