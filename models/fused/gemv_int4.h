// Decode-sized INT4 matmul over torch's own CPU packing (torch._convert_weight_to_int4pack_for_cpu,
// which the quant plugin keeps for prefill), so the fused step needs no copy of its own.
//
// That packing takes output rows in blocks of 64 and, per block, per input column k, 32 bytes:
// byte j holds row j's value in its low nibble and row j + 32's in its high one. So a block is
// multiplied as an outer product, a column at a time: the 64 rows' weights for column k widened
// to four vectors, times x[k] broadcast, with no horizontal sums. Groups of `group` columns
// along k share a scale and a zero per row (torch's [groups, n, 2] BF16 `scales_zeros`, read
// as it is): w = (q - 8) * scale + zero, so a row's sum is
//   sum_g scale_g * (q . x)_g + (zero_g - 8 * scale_g) * sum_{k in g} x_k.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace edgefire::fused {

constexpr int64_t kInt4Block = 64;  // output rows per block of torch's packing

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

#if defined(__AVX512F__)
// Block b's 64 rows against MB rows of x (float32 [MB][k]) with xsum [MB][groups].
template <int MB>
inline void block_int4(const float* x, const float* xsum, const uint8_t* w,
                       const uint16_t* scales_zeros, int64_t k, int64_t group, int64_t n,
                       int64_t b, float* out, int64_t n_out) {
  const int64_t groups = k / group;
  const uint8_t* wb = w + b * k * (kInt4Block / 2);
  const __m512i low = _mm512_set1_epi32(0xF);
  __m512 total[MB][4];
  for (auto& row : total)
    for (auto& t : row) t = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[MB][4];
    for (auto& row : acc)
      for (auto& a : row) a = _mm512_setzero_ps();
    for (int64_t c = g * group; c < (g + 1) * group; ++c) {
      const uint8_t* col = wb + c * (kInt4Block / 2);
      const __m512i first = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col)));
      const __m512i second = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 16)));
      const __m512 q[4] = {  // rows 0-15, 16-31 (low nibbles), 32-47, 48-63 (high)
          _mm512_cvtepi32_ps(_mm512_and_si512(first, low)),
          _mm512_cvtepi32_ps(_mm512_and_si512(second, low)),
          _mm512_cvtepi32_ps(_mm512_srli_epi32(first, 4)),
          _mm512_cvtepi32_ps(_mm512_srli_epi32(second, 4))};
      for (int j = 0; j < MB; ++j) {
        const __m512 xv = _mm512_set1_ps(x[j * k + c]);
        for (int r = 0; r < 4; ++r) acc[j][r] = _mm512_fmadd_ps(q[r], xv, acc[j][r]);
      }
    }
    // 16 rows' (scale, zero) pairs are 32 BF16 words: as 32-bit lanes, scale low, zero high.
    const uint16_t* sz = scales_zeros + (g * n + b * kInt4Block) * 2;
    for (int r = 0; r < 4; ++r) {
      const __m512i pairs = _mm512_loadu_si512(sz + r * 32);
      const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      const __m512 zero = _mm512_castsi512_ps(
          _mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
      const __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.f), scale, zero);
      for (int j = 0; j < MB; ++j)
        total[j][r] = _mm512_fmadd_ps(acc[j][r], scale, _mm512_fmadd_ps(
            offset, _mm512_set1_ps(xsum[j * groups + g]), total[j][r]));
    }
  }
  for (int j = 0; j < MB; ++j)
    for (int r = 0; r < 4; ++r)
      _mm512_storeu_ps(out + j * n_out + b * kInt4Block + r * 16, total[j][r]);
}
#else
template <int MB>
inline void block_int4(const float* x, const float* xsum, const uint8_t* w,
                       const uint16_t* scales_zeros, int64_t k, int64_t group, int64_t n,
                       int64_t b, float* out, int64_t n_out) {
  const int64_t groups = k / group;
  for (int j = 0; j < MB; ++j)
    for (int64_t i = 0; i < kInt4Block; ++i) {
      const int64_t row = b * kInt4Block + i;
      float total = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float acc = 0.f;
        for (int64_t c = g * group; c < (g + 1) * group; ++c) {
          const uint8_t byte = w[(b * k + c) * (kInt4Block / 2) + i % 32];
          acc += static_cast<float>(i < 32 ? byte & 15 : byte >> 4) * x[j * k + c];
        }
        const float scale = bf16_bits_to_float(scales_zeros[(g * n + row) * 2]);
        const float zero = bf16_bits_to_float(scales_zeros[(g * n + row) * 2 + 1]);
        total += acc * scale + (zero - 8.f * scale) * xsum[j * groups + g];
      }
      out[j * n_out + row] = total;
    }
}
#endif

// x [m, k] float32 with xsum [m, k / group] (each group's sum of x), w torch's packing of an
// [n, k] weight, scales_zeros [k / group, n, 2] BF16 bits, out [m, n] float32; n % 64 == 0.
// Blocks are split between the threads; x rows go two at a time (registers: 2 x 4 sums and
// 2 x 4 totals), a block's packed bytes staying in L1 for the next pair.
inline void gemv_int4(const float* x, const float* xsum, int64_t m, int64_t k, int64_t group,
                      const uint8_t* w, const uint16_t* scales_zeros, int64_t n, float* out) {
  const int64_t groups = k / group;
  at::parallel_for(0, n / kInt4Block, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t m0 = 0; m0 < m; m0 += 2) {
        const float* xm = x + m0 * k;
        const float* sm = xsum + m0 * groups;
        if (m - m0 >= 2)
          block_int4<2>(xm, sm, w, scales_zeros, k, group, n, b, out + m0 * n, n);
        else
          block_int4<1>(xm, sm, w, scales_zeros, k, group, n, b, out + m0 * n, n);
      }
  });
}

// x [m, k] -> float32 xf [m, k] and xsum [m, k / group].
template <typename X>
inline void widen_with_group_sums(const X* x, int64_t m, int64_t k, int64_t group, float* xf,
                                  float* xsum) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < k / group; ++g) {
      float total = 0.f;
      for (int64_t c = g * group; c < (g + 1) * group; ++c) {
        xf[r * k + c] = static_cast<float>(x[r * k + c]);
        total += xf[r * k + c];
      }
      xsum[r * (k / group) + g] = total;
    }
}

}  // namespace edgefire::fused
