// Decode-sized INT8 matmuls: out[m, n] = sum_k x[m, k] * w[n, k] * scale[n] for a few rows of
// x (BF16), w weight-only quantized to INT8 with one BF16 scale per output row.
//
// With AVX512-BW, in integers: each x row is rounded to 16-bit integers against its own
// largest value (x ~ s * q), and a weight row's 64-byte line is sign-extended to 16-bit words,
// 32 at a time, each multiplied into x's words two products a lane by one instruction (VNNI's
// vpdpwssd; without VNNI, vpmaddwd and an add). A line costs two sign-extensions and two
// multiply-adds an x row, where widening to float32 costs four sign-extensions, four
// conversions and four FMAs. The float path was compute-bound at one x row on a 2-core Zen 4
// (SmolLM2's o, weight hot in cache: 14.8 us a call, streamed 19.6); this one takes 6.6-10 us
// hot there, and streamed is bound by the read (bench/kernels.py).
// The sums are exact in int32 (the x range is cut so a lane cannot overflow) and a row's
// lanes are added exactly in int64, then rounded to float32 once, so a row's result is the
// same whatever shares its step, however its tiles are ordered, and on AMX tiles from
// kInt8AmxFromRows rows (gemm_int8_amx.h: the same integer totals). x's rounding
// adds at most s / 2 * sum_k |w[n, k]| * scale[n] to an output: at 16 bits, ~1e-5 of the
// product's scale, where the weight's own rounding is up to 1 / 254 of each weight.
// On AVX2 (without AVX-512) the same integers 16 words a multiply-add (vpmaddwd), and the
// same totals and outputs (tile_int8_q16 below). Elsewhere (no AVX2, or k not a multiple of
// 64), x widened to float32 and FMA, as exact as float32 summation.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "gemm_int8_amx.h"
#include "gemm_packed_int8.h"
#include "gemv.h"
#include "x_integers.h"

namespace edgefire::fused {

constexpr int64_t kInt8Ahead = 8192;  // bytes: INT8 tiles ask for their weight this far ahead
constexpr int64_t kInt8Line = 64;     // INT8 values in a cache line

#if defined(__AVX512BW__)
// The exact sums of four int32 vectors' lanes (in int64: the lanes' total may pass int32),
// each then rounded to float32 once. Summed exactly, a total is the same however its products
// were grouped, so the AMX kernel's outputs (gemm_int8_amx.h) are these, bit for bit.
inline __m128 totals4(__m512i a, __m512i b, __m512i c, __m512i d) {
  auto wide = [](__m512i v) {
    return _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)),
                            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1)));
  };
  const __m512i wa = wide(a), wb = wide(b), wc = wide(c), wd = wide(d);
  // per 128-bit lane: (a's pair, b's pair) and (c's, d's)
  auto pairs = [](__m512i x, __m512i y) {
    return _mm512_add_epi64(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y));
  };
  const __m512i ab = pairs(wa, wb), cd = pairs(wc, wd);
  // lanes (ab 0 + 1, ab 2 + 3, cd 0 + 1, cd 2 + 3), then (ab, cd, ..) summed over all four
  const __m512i half = _mm512_add_epi64(_mm512_shuffle_i64x2(ab, cd, 0x88),
                                        _mm512_shuffle_i64x2(ab, cd, 0xDD));
  const __m512i all = _mm512_add_epi64(_mm512_shuffle_i64x2(half, half, 0x88),
                                       _mm512_shuffle_i64x2(half, half, 0xDD));
  return _mm256_cvtepi64_ps(_mm512_castsi512_si256(all));  // (a, b, c, d)
}

// INT8 rows [n0, n0 + 4) against MB rows of x as 16-bit integers (xq) with their scales. One
// or two x rows keep a sum per half line for each (row, x row), so a line's two multiply-adds
// do not wait on each other; from three rows the 4 x MB sums are independent enough.
template <int MB>
inline void tile_int8_q16(const int16_t* xq, const float* xscale, const int8_t* w,
                          const uint16_t* scales, int64_t k, int64_t n0, float* out,
                          int64_t n_out) {
  constexpr int P = MB <= 2 ? 2 : 1;
  Sums16 acc[P][kTileRows][MB];
  for (auto& set : acc)
    for (auto& row : set)
      for (auto& a : row) a = Sums16{};
  // As the float tile below: the bytes kInt8Ahead past this tile's share, along one sequence.
  const char* ahead = reinterpret_cast<const char*>(w + n0 * k) + kInt8Ahead;
  for (int64_t c = 0; c < k; c += kInt8Line)
    for (int i = 0; i < kTileRows; ++i) {
      _mm_prefetch(ahead + c * kTileRows + i * kInt8Line, _MM_HINT_T1);
      const __m512i line = _mm512_loadu_si512(w + (n0 + i) * k + c);
      const __m512i even = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(line));
      const __m512i odd = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(line, 1));
      for (int j = 0; j < MB; ++j) {
        const int16_t* xl = xq + j * k + c;
        acc[0][i][j] = dot_words(acc[0][i][j], even, _mm512_loadu_si512(xl));
        acc[P - 1][i][j] = dot_words(acc[P - 1][i][j], odd, _mm512_loadu_si512(xl + 32));
      }
    }
  const __m128 s = _mm_castsi128_ps(_mm_slli_epi32(
      _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + n0))), 16));
  auto lanes = [&](int i, int j) {
    Sums16 sum = acc[0][i][j];
    if constexpr (P == 2) sum += acc[1][i][j];
    return (__m512i)sum;
  };
  for (int j = 0; j < MB; ++j)
    _mm_storeu_ps(out + j * n_out + n0,
                  _mm_mul_ps(_mm_mul_ps(s, _mm_set1_ps(xscale[j])),
                             totals4(lanes(0, j), lanes(1, j), lanes(2, j), lanes(3, j))));
}

#elif defined(EDGEFIRE_X_INTEGERS)
// AVX2: a lane takes 8 products a line (16 words a multiply-add), twice AVX-512's, so the x
// range that keeps AVX-512's 16 lanes inside int32 (quantize_rows) keeps these inside it only
// over kInt8Span columns; past that the lanes are added into int64 totals and start again.
// The totals are the same integers as AVX-512's, so are the outputs. Zen 3, 2 cores, SmolLM2's
// shapes streamed, against the float path: 1.0-1.6x as fast at 4-16 rows (qkv at 4 rows 39.0
// against 55.0 us), the same at one row (24-31 GB/s, bound by the read).
constexpr int64_t kInt8Span = 4096;  // 128 * 32767 * 4096 / 8 < 2^31

inline int64_t lanes_total(__m256i v) {
  const __m256i wide = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
  alignas(32) int64_t four[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(four), wide);
  return four[0] + four[1] + four[2] + four[3];
}

// INT8 rows [n0, n0 + 4) against MB rows of x as 16-bit integers (xq) with their scales: a
// weight row's line at a time (as tile_int8 below), 16 bytes sign-extended to words and
// multiplied into each x row's words.
template <int MB>
inline void tile_int8_q16(const int16_t* xq, const float* xscale, const int8_t* w,
                          const uint16_t* scales, int64_t k, int64_t n0, float* out,
                          int64_t n_out) {
  int64_t total[kTileRows][MB] = {};
  const char* ahead = reinterpret_cast<const char*>(w + n0 * k) + kInt8Ahead;
  for (int64_t c0 = 0; c0 < k; c0 += kInt8Span) {
    Sums8 acc[kTileRows][MB];
    for (auto& row : acc)
      for (auto& a : row) a = Sums8{};
    for (int64_t c = c0; c < std::min(k, c0 + kInt8Span); c += kInt8Line)
      for (int i = 0; i < kTileRows; ++i) {
        _mm_prefetch(ahead + c * kTileRows + i * kInt8Line, _MM_HINT_T1);
        for (int64_t v = c; v < c + kInt8Line; v += 16) {
          const __m256i words = _mm256_cvtepi8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (n0 + i) * k + v)));
          for (int j = 0; j < MB; ++j)
            acc[i][j] = dot_words(acc[i][j], words, _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(xq + j * k + v)));
        }
      }
    for (int i = 0; i < kTileRows; ++i)
      for (int j = 0; j < MB; ++j) total[i][j] += lanes_total((__m256i)acc[i][j]);
  }
  const __m128 s = _mm_castsi128_ps(_mm_slli_epi32(
      _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + n0))), 16));
  auto as_float = [&](int i, int j) { return static_cast<float>(total[i][j]); };
  for (int j = 0; j < MB; ++j)  // as AVX-512's: (scale * x's scale) * the total
    _mm_storeu_ps(out + j * n_out + n0,
                  _mm_mul_ps(_mm_mul_ps(s, _mm_set1_ps(xscale[j])),
                             _mm_setr_ps(as_float(0, j), as_float(1, j), as_float(2, j),
                                         as_float(3, j))));
}
#endif

#if defined(EDGEFIRE_SIMD)
// The float32 path: INT8 rows [n0, n0 + 4) against MB rows of x widened to float32 (xf),
// times each row's BF16 scale. Integers up to 127 are exact in float32, so this is the dequantized weight's product.
template <int MB>
inline void tile_int8(const float* xf, const int8_t* w, const uint16_t* scales, int64_t k,
                      int64_t n0, float* out, int64_t n_out) {
  vf acc[kTileRows][MB];
  for (auto& row : acc)
    for (auto& a : row) a = vzero();
  // The tile's four rows lie one after another in memory (4k bytes), and a step reads a
  // vector of each: k / kWidth steps of 4 * kWidth bytes. Each step asks for the bytes that
  // far past its share of the tile, kInt8Ahead on, so the tiles after this one stream in
  // along one address sequence as it is multiplied. (Each row asking for the next tile's row
  // only 4k bytes on, one x row read SmolLM2's shapes from memory at 17.6-24.2 GB/s; this way
  // 19.6-28.4, 2-core Xeon.)
  const char* ahead = reinterpret_cast<const char*>(w + n0 * k) + kInt8Ahead;
  auto step = [&](int i, int64_t c) {
    const vf wv = vload_i8(w + (n0 + i) * k + c);
    for (int j = 0; j < MB; ++j) acc[i][j] = vfmadd(wv, vload(xf + j * k + c), acc[i][j]);
  };
  int64_t c = 0;
  // With one or two x rows, a row's whole cache line (4 vectors) at a time: widening takes
  // most of such a tile's work, and line by line it ran in half the time with the weight hot
  // in cache (SmolLM2's shapes, Zen 5, 2 cores; from memory, within the machine's noise). From
  // three rows the multiplies dominate and vector by vector streamed faster (gate_up, 4 rows:
  // 53-67 against 74-76 us). Each accumulator takes its row's vectors in the same order
  // either way, so a row's result does not depend on how many share its step.
  if constexpr (MB <= 2) {
    for (; c + kInt8Line <= k; c += kInt8Line)
      for (int i = 0; i < kTileRows; ++i) {
        _mm_prefetch(ahead + c * kTileRows + i * kInt8Line, _MM_HINT_T1);
        for (int64_t v = c; v < c + kInt8Line; v += kWidth) step(i, v);
      }
  }
  for (; c < k; c += kWidth) {
    _mm_prefetch(ahead + c * kTileRows, _MM_HINT_T1);
    for (int i = 0; i < kTileRows; ++i) step(i, c);
  }
  const __m128 s = _mm_castsi128_ps(_mm_slli_epi32(
      _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + n0))), 16));
  for (int j = 0; j < MB; ++j)
    _mm_storeu_ps(out + j * n_out + n0,
                  _mm_mul_ps(s, reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j])));
}
#else
template <int MB>
inline void tile_int8(const float* xf, const int8_t* w, const uint16_t* scales, int64_t k,
                      int64_t n0, float* out, int64_t n_out) {
  for (int i = 0; i < kTileRows; ++i)
    for (int j = 0; j < MB; ++j) {
      float acc = 0.f;
      for (int64_t c = 0; c < k; ++c) acc += static_cast<float>(w[(n0 + i) * k + c]) * xf[j * k + c];
      out[j * n_out + n0 + i] = acc * widen(scales[n0 + i]);
    }
}
#endif

// x [m, k] BF16, w [n, k] INT8, scales [n] BF16 bits, out [m, n] float32; n % 4 == 0,
// k % 16 == 0. scratch: room for m * k floats. packed: w packed as pairs
// (gemm_packed_int8.h), or null.
inline void gemv_int8(const c10::BFloat16* x, int64_t m, int64_t k, const int8_t* w,
                      const uint16_t* scales, int64_t n, float* out, float* scratch,
                      const int8_t* packed = nullptr) {
#if defined(EDGEFIRE_X_INTEGERS)
  if (k % kInt8Line == 0) {
    // m * k words, then m scales: within m * k floats
    auto* xq = reinterpret_cast<int16_t*>(scratch);
    float* xscale = scratch + (m * k + 1) / 2;
    quantize_rows(x, m, k, xq, xscale);
#if defined(__AVX512DQ__)
    if (m >= kInt8AmxFromRows && n % kInt8AmxRows == 0 && k <= kInt8AmxMaxK &&
        amx_int8_usable())
      return gemm_int8_amx(xq, xscale, m, k, w, scales, n, out);
    if (packed != nullptr && m >= kInt8PackedFromRows)
      return gemm_packed_int8(xq, xscale, m, k, packed, scales, n, out);
#endif
    over_tiles(m, n, [&](int64_t mb, int64_t m0, int64_t n0) {
      with_rows(mb, [&](auto rows) {
        tile_int8_q16<rows()>(xq + m0 * k, xscale + m0, w, scales, k, n0, out + m0 * n, n);
      });
    });
    return;
  }
#endif
  for (int64_t i = 0; i < m * k; ++i) scratch[i] = static_cast<float>(x[i]);
  over_tiles(m, n, [&](int64_t mb, int64_t m0, int64_t n0) {
    with_rows(mb, [&](auto rows) {
      tile_int8<rows()>(scratch + m0 * k, w, scales, k, n0, out + m0 * n, n);
    });
  });
}

}  // namespace edgefire::fused
