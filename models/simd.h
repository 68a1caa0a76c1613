// The vector operations this project's CPU kernels are written in, for AVX-512 (16 floats a
// vector) or AVX2 with FMA (8): a kernel written once against `vf` and these functions runs on
// both (EDGEFIRE_SIMD says whether either is there; kernels keep a scalar loop for neither).
#pragma once

#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define EDGEFIRE_SIMD 1
#include <immintrin.h>

namespace edgefire::simd {

// BF16 dot products (vdpbf16ps): two products a lane, for the kernels' BF16 paths.
#if defined(__AVX512BF16__)
constexpr bool kHasBf16Pairs = true;
#else
constexpr bool kHasBf16Pairs = false;
#endif

#if defined(__AVX512F__)
using vf = __m512;
constexpr int64_t kWidth = 16;

inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vfmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
inline float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
// kWidth BF16 values (their bits) as float32: BF16 is the top half of a float32.
inline vf vload_bf16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vf vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline vf vround(vf v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline vf vscale2(vf p, vf k) { return _mm512_scalef_ps(p, k); }  // p * 2^k, k integral
// kWidth bytes' low and high nibbles, as floats.
inline void vnibbles(const uint8_t* p, vf& low, vf& high) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  low = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0xF)));
  high = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}
// kWidth pairs of BF16 words (first, second), each pair a 32-bit lane, as two float vectors.
inline void vload_bf16_pairs(const uint16_t* p, vf& first, vf& second) {
  const __m512i pairs = _mm512_loadu_si512(p);
  first = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
  second = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
// kWidth floats rounded to BF16 (to nearest, ties to even; NaN stays NaN) as c10::BFloat16
// rounds one: the bias 0x7FFF plus the kept part's lowest bit, then the top half.
inline void vstore_bf16(uint16_t* p, vf v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline vf vabs(vf v) { return _mm512_abs_ps(v); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
// where x < 0, a; elsewhere b
inline vf vwhere_negative(vf x, vf a, vf b) {
  return _mm512_mask_mov_ps(b, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), a);
}
#else
using vf = __m256;
constexpr int64_t kWidth = 8;

inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float x) { return _mm256_set1_ps(x); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vfmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline __m128 fold(vf v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); }
inline float vsum(vf v) {
  __m128 s = fold(v);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float vhmax(vf v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline vf vload_bf16(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vf vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vf vround(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf vscale2(vf p, vf k) {  // p * 2^k for integral k in [-126, 127]: build 2^k's bits
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k),
                                                          _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
inline void vnibbles(const uint8_t* p, vf& low, vf& high) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  low = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0xF)));
  high = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
inline void vload_bf16_pairs(const uint16_t* p, vf& first, vf& second) {
  const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  first = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
  second = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline void vstore_bf16(uint16_t* p, vf v) {  // as the AVX-512 one
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  // 32-bit lanes to 16-bit words: packed within each 128-bit half, then the halves joined
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(words));
}
inline vf vabs(vf v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), v); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vwhere_negative(vf x, vf a, vf b) {
  return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}
#endif

// The sums of four vectors' lanes, as four floats: one horizontal-add tree for all four
// instead of four separate reductions.
inline __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
#if defined(__AVX512F__)
inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  auto fold = [](__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  };
  return reduce4(fold(a0), fold(a1), fold(a2), fold(a3));
}
#endif

// e^(x - shift) for x - shift <= 0: Cody-Waite reduction to x = k ln2 + r and a degree-6
// polynomial for 2^f (relative error ~1e-7, float32 rounding level); below -87 it is 2^-126.
inline vf vexp_shifted(vf x, vf shift) {
  const vf v = vmax(vsub(x, shift), vset1(-87.f));
  const vf t = vmul(v, vset1(1.44269504f));
  const vf k = vround(t);
  const vf f = vsub(t, k);
  vf p = vfmadd(vset1(0.00015404f), f, vset1(0.00133336f));
  p = vfmadd(p, f, vset1(0.00961813f));
  p = vfmadd(p, f, vset1(0.05550411f));
  p = vfmadd(p, f, vset1(0.24022652f));
  p = vfmadd(p, f, vset1(0.69314718f));
  p = vfmadd(p, f, vset1(1.f));
  return vscale2(p, k);
}

// 1 / (1 + e^-x) without overflow: e = e^-|x| <= 1, and for x < 0 the sigmoid is e / (1 + e).
inline vf vsigmoid(vf x) {
  const vf e = vexp_shifted(vsub(vzero(), vabs(x)), vzero());
  const vf s = vdiv(vset1(1.f), vadd(vset1(1.f), e));
  return vwhere_negative(x, vmul(e, s), s);
}

}  // namespace edgefire::simd
#endif
