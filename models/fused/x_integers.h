// x rows as 16-bit integers for the INT8 and INT4 kernels' integer paths (gemv_int8.h,
// gemv_int4.h): each row rounded against its own largest value, x ~ scale * q, so a weight's
// small integers multiply into it exactly in int32, two products a lane. The AVX-512 and AVX2
// builds round a row to the same integers and scale (same operations per value), so a
// kernel's exact integer totals, and its outputs, are the same on both.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>

#include "../simd.h"

namespace edgefire::fused {

// Where the integer paths are built: AVX-512 with BW, or AVX2 (with FMA) without AVX-512.
#if defined(__AVX512BW__) || (defined(__AVX2__) && defined(EDGEFIRE_SIMD) && !defined(__AVX512F__))
#define EDGEFIRE_X_INTEGERS 1
using namespace edgefire::simd;

// The kernels' int32 sums, typed as vectors of int32 (GCC's __v8si, __v16si) rather than
// __m256i / __m512i (vectors of int64). Why: GCC 12 does not keep an array of __m512i sums in
// registers across the int32 instructions that update them (each is viewed as int32 lanes and
// back): it moved every sum into a spare register and out again around each dot product and
// spilled the rest to the stack, in the INT8 and INT4 tiles alike. Typed as the lanes the
// instructions work on, the sums stay in their registers (the 6 x 4 tile of
// gemm_packed_int8.h: 24 dot products, 4 sign-extensions and 6 broadcasts a pair of K, no
// moves).
using Sums8 = __v8si;
// acc + a[2i] * b[2i] + a[2i + 1] * b[2i + 1] in each 32-bit lane i, a and b 16-bit integers.
inline Sums8 dot_words(Sums8 acc, __m256i a, __m256i b) {
  return (Sums8)_mm256_add_epi32((__m256i)acc, _mm256_madd_epi16(a, b));
}
#if defined(__AVX512BW__)
using Sums16 = __v16si;
inline Sums16 dot_words(Sums16 acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return (Sums16)_mm512_dpwssd_epi32((__m512i)acc, a, b);
#else
  return (Sums16)_mm512_add_epi32((__m512i)acc, _mm512_madd_epi16(a, b));
#endif
}

inline bool any_unordered(__m512 v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
// kWidth floats rounded to nearest (even) and saturated to 16-bit integers.
inline void store_words(int16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(v)));
}
#else
inline bool any_unordered(__m256 v) {
  return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0;
}
inline void store_words(int16_t* p, __m256 v) {
  const __m256i lanes = _mm256_cvtps_epi32(v);
  // packed (with signed saturation) within each 128-bit half, then the halves joined
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lanes, lanes), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(words));
}
#endif

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
    vf largest = vzero();
    bool nan = false;  // a NaN in x makes the row's outputs NaN, as a float product would
    for (int64_t c = 0; c < k; c += kWidth) {
      const vf v = vload_bf16(row + c);
      largest = vmax(largest, vabs(v));
      nan |= any_unordered(v);
    }
    const float most = vhmax(largest);
    const vf inv = vset1(most > 0.f ? top / most : 0.f);
    xscale[r] = nan ? std::numeric_limits<float>::quiet_NaN() : most / top;
    for (int64_t c = 0; c < k; c += kWidth) store_words(xq + r * k + c, vmul(vload_bf16(row + c), inv));
  }
}
#endif

}  // namespace edgefire::fused
