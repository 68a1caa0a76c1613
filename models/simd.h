// Small AVX-512 helpers shared by this project's CPU kernels.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace edgefire::simd {

// The sums of four vectors' lanes, as four floats: one horizontal-add tree for all four
// instead of four separate reductions.
inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  auto fold = [](__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  };
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(fold(a0), fold(a1)),
                                  _mm256_hadd_ps(fold(a2), fold(a3)));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

}  // namespace edgefire::simd
#endif
