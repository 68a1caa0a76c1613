// Decode-sized matmuls: out[m, n] = sum_k x[m, k] * w[n, k] for a few rows of x (a decode
// step's tokens), float32 accumulated and out; w in BF16 (x in BF16), or weight-only quantized
// (x in float32): INT8 with one scale per output row, or INT4 in groups along k with a scale
// and an offset per group. Quantized weights are read at their width and widened in registers.
//
// At a few rows a projection is a read of its weight: each 32-value chunk of a weight
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

#include "../simd.h"

namespace edgefire::fused {

constexpr int64_t kTileRows = 4;  // weight rows per tile
constexpr int64_t kChunk = 32;    // K must be a multiple: one dot-product instruction's width

#if defined(__AVX512F__)
using edgefire::simd::reduce4;
#endif

#if defined(__AVX512BF16__)
constexpr bool kNativeDot = true;

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

#if defined(__AVX512F__)
// INT8 rows [n0, n0 + 4) against MB rows of x widened to float32 (xf), times each row's scale.
// Integers up to 127 are exact in float32, so this is the dequantized weight's product.
template <int MB>
inline void tile_int8(const float* xf, const int8_t* w, const float* scales, int64_t k,
                      int64_t n0, float* out, int64_t n_out) {
  __m512 acc[kTileRows][MB];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; c += 16) {
    for (int i = 0; i < kTileRows; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + i + kTileRows) * k + c), _MM_HINT_T0);
      const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (n0 + i) * k + c))));
      for (int j = 0; j < MB; ++j)
        acc[i][j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xf + j * k + c), acc[i][j]);
    }
  }
  const __m128 s = _mm_loadu_ps(scales + n0);
  for (int j = 0; j < MB; ++j)
    _mm_storeu_ps(out + j * n_out + n0,
                  _mm_mul_ps(s, reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j])));
}
#else
template <int MB>
inline void tile_int8(const float* xf, const int8_t* w, const float* scales, int64_t k,
                      int64_t n0, float* out, int64_t n_out) {
  for (int i = 0; i < kTileRows; ++i)
    for (int j = 0; j < MB; ++j) {
      float acc = 0.f;
      for (int64_t c = 0; c < k; ++c) acc += static_cast<float>(w[(n0 + i) * k + c]) * xf[j * k + c];
      out[j * n_out + n0 + i] = acc * scales[n0 + i];
    }
}
#endif

#if defined(__AVX512F__)
// INT4 rows [n0, n0 + 4): two values a byte, the low nibble the even column. x comes as `xeo`,
// each 32-column chunk's 16 even columns then its 16 odd ones, so a byte's two nibbles meet
// their x values without a shuffle. Per group g of the row: w = q * scales[g] + offsets[g], so
// the row's sum is sum_g scales[g] * (q . x)_g + sum_g offsets[g] * xsum[g], xsum holding each
// group's sum of x (per x row).
template <int MB>
inline void tile_int4(const float* xeo, const float* xsum, const uint8_t* w,
                      const float* scales, const float* offsets, int64_t k, int64_t group,
                      int64_t n0, float* out, int64_t n_out) {
  const int64_t groups = k / group;
  __m512 acc[kTileRows][MB];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi32(0xF);
  for (int64_t c = 0; c < k; c += kChunk) {
    for (int i = 0; i < kTileRows; ++i) {
      const uint8_t* wr = w + (n0 + i) * (k / 2);
      _mm_prefetch(reinterpret_cast<const char*>(wr + kTileRows * (k / 2) + c / 2), _MM_HINT_T0);
      const __m512i bytes = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + c / 2)));
      const __m512 even = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, low));
      const __m512 odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
      const __m512 s = _mm512_set1_ps(scales[(n0 + i) * groups + c / group]);
      for (int j = 0; j < MB; ++j) {
        const float* xc = xeo + j * k + c;
        const __m512 part = _mm512_fmadd_ps(even, _mm512_loadu_ps(xc),
                                            _mm512_mul_ps(odd, _mm512_loadu_ps(xc + 16)));
        acc[i][j] = _mm512_fmadd_ps(s, part, acc[i][j]);
      }
    }
  }
  for (int j = 0; j < MB; ++j) {
    alignas(16) float sums[kTileRows];
    _mm_store_ps(sums, reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
    for (int i = 0; i < kTileRows; ++i) {
      const float* off = offsets + (n0 + i) * groups;
      float total = sums[i];
      for (int64_t g = 0; g < groups; ++g) total += off[g] * xsum[j * groups + g];
      out[j * n_out + n0 + i] = total;
    }
  }
}
#else
template <int MB>
inline void tile_int4(const float* xeo, const float* xsum, const uint8_t* w,
                      const float* scales, const float* offsets, int64_t k, int64_t group,
                      int64_t n0, float* out, int64_t n_out) {
  const int64_t groups = k / group;
  for (int i = 0; i < kTileRows; ++i)
    for (int j = 0; j < MB; ++j) {
      float total = 0.f;
      for (int64_t c = 0; c < k; c += kChunk)
        for (int64_t b = 0; b < 16; ++b) {
          const uint8_t byte = w[(n0 + i) * (k / 2) + c / 2 + b];
          const float* xc = xeo + j * k + c;
          total += scales[(n0 + i) * groups + c / group] * ((byte & 15) * xc[b] + (byte >> 4) * xc[16 + b]);
        }
      for (int64_t g = 0; g < groups; ++g) total += offsets[(n0 + i) * groups + g] * xsum[j * groups + g];
      out[j * n_out + n0 + i] = total;
    }
}
#endif

// Runs tile_for(MB, x row offset, n0) over every 4-row tile of the weight and every group of up
// to four x rows, the weight's tiles split between the threads: each thread reads its part of
// the weight once, multiplying it into all rows of x.
template <typename TileFor>
inline void over_tiles(int64_t m, int64_t n, TileFor tile_for) {
  at::parallel_for(0, n / kTileRows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kTileRows;
      for (int64_t m0 = 0; m0 < m; m0 += 4) tile_for(std::min<int64_t>(4, m - m0), m0, n0);
    }
  });
}

// x [m, k] and w [n, k] as BF16 bits, out [m, n] float32; n % 4 == 0, k % 32 == 0.
inline void gemv_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                      float* out) {
  over_tiles(m, n, [&](int64_t mb, int64_t m0, int64_t n0) {
    const uint16_t* xm = x + m0 * k;
    float* o = out + m0 * n;
    switch (mb) {
      case 4: tile<4>(xm, w, k, n0, o, n); break;
      case 3: tile<3>(xm, w, k, n0, o, n); break;
      case 2: tile<2>(xm, w, k, n0, o, n); break;
      default: tile<1>(xm, w, k, n0, o, n); break;
    }
  });
}

// x [m, k] float32, w [n, k] INT8, scales [n] float32, out [m, n] float32; n % 4 == 0,
// k % 16 == 0.
inline void gemv_int8(const float* x, int64_t m, int64_t k, const int8_t* w,
                      const float* scales, int64_t n, float* out) {
  over_tiles(m, n, [&](int64_t mb, int64_t m0, int64_t n0) {
    const float* xm = x + m0 * k;
    float* o = out + m0 * n;
    switch (mb) {
      case 4: tile_int8<4>(xm, w, scales, k, n0, o, n); break;
      case 3: tile_int8<3>(xm, w, scales, k, n0, o, n); break;
      case 2: tile_int8<2>(xm, w, scales, k, n0, o, n); break;
      default: tile_int8<1>(xm, w, scales, k, n0, o, n); break;
    }
  });
}

// x [m, k] float32 (arranged by arrange_int4), xsum [m, k / group], w [n, k / 2] nibbles,
// scales and offsets [n, k / group] float32, out [m, n]; n % 4 == 0, k % 32 == 0, group % 32 == 0.
inline void gemv_int4(const float* xeo, const float* xsum, int64_t m, int64_t k, int64_t group,
                      const uint8_t* w, const float* scales, const float* offsets, int64_t n,
                      float* out) {
  over_tiles(m, n, [&](int64_t mb, int64_t m0, int64_t n0) {
    const float* xm = xeo + m0 * k;
    const float* sm = xsum + m0 * (k / group);
    float* o = out + m0 * n;
    switch (mb) {
      case 4: tile_int4<4>(xm, sm, w, scales, offsets, k, group, n0, o, n); break;
      case 3: tile_int4<3>(xm, sm, w, scales, offsets, k, group, n0, o, n); break;
      case 2: tile_int4<2>(xm, sm, w, scales, offsets, k, group, n0, o, n); break;
      default: tile_int4<1>(xm, sm, w, scales, offsets, k, group, n0, o, n); break;
    }
  });
}

// x [m, k] -> xeo (each 32-column chunk: even columns, then odd) and xsum [m, k / group].
template <typename X>
inline void arrange_int4(const X* x, int64_t m, int64_t k, int64_t group, float* xeo,
                         float* xsum) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; c += kChunk)
      for (int64_t b = 0; b < 16; ++b) {
        xeo[r * k + c + b] = static_cast<float>(x[r * k + c + 2 * b]);
        xeo[r * k + c + 16 + b] = static_cast<float>(x[r * k + c + 2 * b + 1]);
      }
    for (int64_t g = 0; g < k / group; ++g) {
      float total = 0.f;
      for (int64_t c = 0; c < group; ++c) total += static_cast<float>(x[r * k + g * group + c]);
      xsum[r * (k / group) + g] = total;
    }
  }
}

}  // namespace edgefire::fused
