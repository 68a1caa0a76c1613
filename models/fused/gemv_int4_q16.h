// The INT4 kernel's integer blocks (gemv_int4.h says how torch packs the weight and how a
// row's sum is made of its groups): x rows as 16-bit integers (x_integers.h), the nibbles as
// 16-bit words, two columns' products a lane (dot_words), for torch's AVX-512 packing (blocks
// of 64 rows, with AVX512-BW and VBMI) and its AVX2 one (blocks of 32, without AVX-512). Only
// how a line of two columns becomes word vectors differs (ColumnPairs); a group's sums are
// exact in int32 and scaled into out at its end, in group order, by the same operations on
// both, so a row's result does not depend on the rows beside it, nor on the vector width.
#pragma once

#include <cstdint>
#include <cstring>

#include "../simd.h"
#include "x_integers.h"

namespace edgefire::fused {

constexpr int64_t kInt4Ahead = 8192;  // bytes: how far ahead a block asks for its weight

#if defined(__AVX512BW__) && defined(__AVX512VBMI__)
#define EDGEFIRE_INT4_INTEGERS 1
// torch's AVX-512 packing: a 64-byte line holds columns c and c + 1 of the block (32 bytes
// each); two byte permutations spread it into words (row d of c, row d of c + 1), one vector
// for rows 0-15 and 32-47 (bytes 0-15: low and high nibbles) and one for 16-31 and 48-63; a
// mask and a shift take the nibbles. 128 weights cost 7 operations and 4 multiply-adds an x
// row, where widening to float32 costs 20 and 8 FMAs.
constexpr int64_t kInt4IntegerBlock = 64;
using Words = __m512i;
using Sums = Sums16;
constexpr int kWordRows[4] = {0, 32, 16, 48};  // first row of each word vector's 16

inline Words pair_words(int32_t pair) { return _mm512_set1_epi32(pair); }
inline vf sums_as_float(Sums v) { return _mm512_cvtepi32_ps((__m512i)v); }

// Byte indices: word i of the result takes row 16 * half + i's byte of column c (line byte
// 16 * half + i) and of column c + 1 (line byte 32 + 16 * half + i); odd bytes are masked off.
inline __m512i column_pairs_index(int half) {
  alignas(64) int8_t index[64] = {};
  for (int i = 0; i < 16; ++i) {
    index[4 * i] = static_cast<int8_t>(16 * half + i);
    index[4 * i + 2] = static_cast<int8_t>(32 + 16 * half + i);
  }
  return _mm512_load_si512(index);
}

// A line's two columns as the four word vectors of kWordRows.
struct ColumnPairs {
  const __m512i index0 = column_pairs_index(0), index1 = column_pairs_index(1);
  const __m512i nibble = _mm512_set1_epi16(0xF);

  void operator()(const uint8_t* line, Words (&q)[4]) const {
    constexpr __mmask64 kEvenBytes = 0x5555555555555555ULL;
    const __m512i bytes = _mm512_loadu_si512(line);
    const __m512i a = _mm512_maskz_permutexvar_epi8(kEvenBytes, index0, bytes);
    const __m512i b = _mm512_maskz_permutexvar_epi8(kEvenBytes, index1, bytes);
    q[0] = _mm512_and_si512(a, nibble);
    q[1] = _mm512_srli_epi16(a, 4);
    q[2] = _mm512_and_si512(b, nibble);
    q[3] = _mm512_srli_epi16(b, 4);
  }
};
#elif defined(EDGEFIRE_X_INTEGERS) && !defined(__AVX512F__)
#define EDGEFIRE_INT4_INTEGERS 1
// torch's AVX2 packing: a 32-byte line holds columns c and c + 1 (16 bytes each); their bytes
// interleaved (row d of c, row d of c + 1) and zero-extended to words, a mask and a shift take
// the low nibbles (rows 0-15) and the high ones (16-31). 32 weights cost 8 operations and 4
// multiply-adds an x row, where widening to float32 costs 20 and 8 FMAs. Zen 3, 2 cores,
// SmolLM2's shapes streamed: one row reads 25-31 GB/s where the float path read 19-22; 2-16
// rows 1.1-1.2x as fast as it.
constexpr int64_t kInt4IntegerBlock = 32;
using Words = __m256i;
using Sums = Sums8;
constexpr int kWordRows[4] = {0, 8, 16, 24};  // first row of each word vector's 8

inline Words pair_words(int32_t pair) { return _mm256_set1_epi32(pair); }
inline vf sums_as_float(Sums v) { return _mm256_cvtepi32_ps((__m256i)v); }

struct ColumnPairs {
  const __m256i nibble = _mm256_set1_epi16(0xF);

  void operator()(const uint8_t* line, Words (&q)[4]) const {
    const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(line));
    const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(line + 16));
    const __m256i a = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(first, second));  // rows 0-7
    const __m256i b = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(first, second));  // rows 8-15
    q[0] = _mm256_and_si256(a, nibble);
    q[1] = _mm256_and_si256(b, nibble);
    q[2] = _mm256_srli_epi16(a, 4);
    q[3] = _mm256_srli_epi16(b, 4);
  }
};
#endif

#if defined(EDGEFIRE_INT4_INTEGERS)
template <int MB>
inline void block_int4_q16(const int16_t* xq, const float* xscale, const float* xqsum,
                           const uint8_t* w, const uint16_t* scales_zeros, int64_t k,
                           int64_t group, int64_t n, int64_t r0, float* out, int64_t n_out) {
  const int64_t groups = k / group, col_bytes = kInt4IntegerBlock / 2;
  const uint8_t* wb = w + r0 * k / 2;
  const ColumnPairs column_pairs;
  for (int j = 0; j < MB; ++j)
    for (int v = 0; v < 4; ++v) vstore(out + j * n_out + r0 + kWordRows[v], vzero());
  for (int64_t g = 0; g < groups; ++g) {
    Sums acc[4][MB];
    for (auto& row : acc)
      for (auto& a : row) a = Sums{};
    for (int64_t c = g * group; c < (g + 1) * group; c += 2) {
      const uint8_t* line = wb + c * col_bytes;
      _mm_prefetch(reinterpret_cast<const char*>(line) + kInt4Ahead, _MM_HINT_T1);
      Words q[4];
      column_pairs(line, q);
      for (int j = 0; j < MB; ++j) {
        int32_t pair;  // x's columns c and c + 1, one lane
        std::memcpy(&pair, xq + j * k + c, sizeof pair);
        const Words xv = pair_words(pair);
        for (int v = 0; v < 4; ++v) acc[v][j] = dot_words(acc[v][j], q[v], xv);
      }
    }
    // The group's scales and zeros for the next block (a row of the [groups, n, 2] table
    // away from this group's last): the weights stream in ahead, these would not.
    const uint16_t* next = scales_zeros + (g * n + r0 + kInt4IntegerBlock) * 2;
    if (r0 + kInt4IntegerBlock < n)
      for (int64_t b = 0; b < kInt4IntegerBlock * 4; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next) + b, _MM_HINT_T1);
    for (int v = 0; v < 4; ++v) {
      vf scale, zero;
      vload_bf16_pairs(scales_zeros + (g * n + r0 + kWordRows[v]) * 2, scale, zero);
      const vf offset = vsub(zero, vmul(vset1(8.f), scale));
      for (int j = 0; j < MB; ++j) {
        float* total = out + j * n_out + r0 + kWordRows[v];
        vstore(total, vfmadd(sums_as_float(acc[v][j]), scale,
                             vfmadd(offset, vset1(xqsum[j * groups + g]), vload(total))));
      }
    }
  }
  for (int j = 0; j < MB; ++j)
    for (int v = 0; v < 4; ++v) {
      float* total = out + j * n_out + r0 + kWordRows[v];
      vstore(total, vmul(vload(total), vset1(xscale[j])));
    }
}
#endif

}  // namespace edgefire::fused
